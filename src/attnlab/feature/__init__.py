"""Feature-related attention (survey section 3.1): mechanisms defined by the features they
attend over -- several inputs (co-attention, rotatory attention), several levels
(attention-via-attention, hierarchical attention) and several representations
(meta-embeddings). Each is composed from the general parts in :mod:`attnlab.general`.

Every mechanism is called ``forward(query, key=None, value=None, *, mask=None,
need_weights=False, ...)`` and returns an :class:`~attnlab.output.AttentionOutput` (or a
documented subclass); how each maps its inputs onto ``query``/``key``/``value`` is in the
"Call" section of its page in ``docs/feature/``.
"""

from attnlab.feature.co_attention import (
    AlternatingCoAttention,
    CoAttentionAffinity,
    CoAttentionOutput,
    InteractiveCoAttention,
    MultiGrainedCoAttention,
    ParallelCoAttention,
    bilinear_affinity,
    masked_mean,
    max_pooled_scores,
    trilinear_affinity,
)
from attnlab.feature.meta_embedding import CDME, DME, EmbeddingSpec, MetaEmbedding
from attnlab.feature.multilevel import (
    AttentionViaAttention,
    HierarchicalAttention,
    MaskedRNN,
    char_word_map,
    hierarchy_mask,
    pad_hierarchy,
)
from attnlab.feature.rotatory import LCRRotHop, RotatoryAttention, RotatoryOutput

__all__ = [
    "CDME",
    "DME",
    "AlternatingCoAttention",
    "AttentionViaAttention",
    "CoAttentionAffinity",
    "CoAttentionOutput",
    "EmbeddingSpec",
    "HierarchicalAttention",
    "InteractiveCoAttention",
    "LCRRotHop",
    "MaskedRNN",
    "MetaEmbedding",
    "MultiGrainedCoAttention",
    "ParallelCoAttention",
    "RotatoryAttention",
    "RotatoryOutput",
    "bilinear_affinity",
    "char_word_map",
    "hierarchy_mask",
    "masked_mean",
    "max_pooled_scores",
    "pad_hierarchy",
    "trilinear_affinity",
]
