"""Query-related attention (survey section 3.3): mechanisms defined by their queries --
self-attention, multi-head, multi-hop, capsule-based, attention-over-attention, graph
attention, pointer networks and the Transformer variants -- composed from
:mod:`attnlab.general`.

Every mechanism is importable from here (``from attnlab.query import MultiHeadAttention``)
and as ``attnlab.<Name>``. The modules follow one call convention,
``forward(query, key=None, value=None, *, mask=None, need_weights=False, ...)``; see
``docs/call-convention.md``.
"""

from attnlab._deprecation import deprecated_aliases
from attnlab.query.attention_over_attention import (
    AoAOutput,
    AttentionOverAttention,
    aoa_answer_scores,
    attention_over_attention,
)
from attnlab.query.capsule import (
    CapsuleAttention,
    CapsuleOutput,
    CapsuleRouting,
    RoutingOutput,
    capsule_loss,
    margin_loss,
    squash,
)
from attnlab.query.graph import GraphAttention
from attnlab.query.key_value import (
    DEPRECATED_ALIASES,
    ConcatenatedKeyValueAttention,
    KeyValueAttention,
    concatenated_key_value_attention,
    key_value_attention,
)
from attnlab.query.linformer import LinformerAttention
from attnlab.query.multi_head import MultiHeadAttention
from attnlab.query.multi_hop import MultiHopAttention, masked_mean_values
from attnlab.query.pointer import (
    PointerDecoding,
    PointerNetwork,
    PointerOutput,
    masked_log_softmax,
    pointer_loss,
)
from attnlab.query.positional import (
    LearnedPositions,
    RelativePositionAttention,
    RotaryPositions,
    SinusoidalPositions,
    relative_position_attention,
    relative_position_index,
    rotary_embedding,
    sinusoidal_encoding,
    sinusoidal_positions,
)
from attnlab.query.reformer import LSHAttention, lsh_buckets
from attnlab.query.self_attention import (
    ConstantQuerySelfAttention,
    LearnedQuerySelfAttention,
    RelationalSelfAttention,
    orthogonality_penalty,
)
from attnlab.query.synthesizer import SynthesizerAttention, default_factors
from attnlab.query.transformer import (
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    build_attention,
)
from attnlab.query.transformer_xl import TransformerXLAttention, rel_shift, sinusoid_encoding

__all__ = [
    "AoAOutput",
    "AttentionOverAttention",
    "CapsuleAttention",
    "CapsuleOutput",
    "CapsuleRouting",
    "ConcatenatedKeyValueAttention",
    "ConstantQuerySelfAttention",
    "GraphAttention",
    "KeyValueAttention",
    "LSHAttention",
    "LearnedPositions",
    "LearnedQuerySelfAttention",
    "LinformerAttention",
    "MultiHeadAttention",
    "MultiHopAttention",
    "PointerDecoding",
    "PointerNetwork",
    "PointerOutput",
    "RelationalSelfAttention",
    "RelativePositionAttention",
    "RotaryPositions",
    "RoutingOutput",
    "SinusoidalPositions",
    "SynthesizerAttention",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "TransformerXLAttention",
    "aoa_answer_scores",
    "attention_over_attention",
    "build_attention",
    "capsule_loss",
    "concatenated_key_value_attention",
    "default_factors",
    "key_value_attention",
    "lsh_buckets",
    "margin_loss",
    "masked_log_softmax",
    "masked_mean_values",
    "orthogonality_penalty",
    "pointer_loss",
    "rel_shift",
    "relative_position_attention",
    "relative_position_index",
    "rotary_embedding",
    "sinusoid_encoding",
    "sinusoidal_encoding",
    "sinusoidal_positions",
    "squash",
]

#: the names renamed in 0.1 (``DEPRECATED_ALIASES``: deprecated aliases for one release,
#: with a DeprecationWarning)
__getattr__ = deprecated_aliases(__name__, DEPRECATED_ALIASES)
