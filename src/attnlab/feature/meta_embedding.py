"""Multi-representational attention (survey section 3.1.3): dynamic meta-embeddings.

| name | definition | source |
| --- | --- | --- |
| dme | ``x_ti = W_i x_i + b_i``; ``alpha_i = softmax_i(score(x_ti))`` over the available embeddings; ``x = sum_i alpha_i x_ti`` | Kiela, Wang & Cho 2018 |
| cdme | as DME, but ``alpha_ij = softmax_i(score(h_ij))`` with ``h_ij`` the BiLSTM state at token ``j`` over embedding ``i``'s projected sequence | Kiela, Wang & Cho 2018 |

The weighting is the general model with a query-less score over the ``E`` embeddings of a
token: one :class:`attnlab.Attention` call on ``[B * n, E, d']`` keys, with the
per-embedding availability as its mask (so a missing embedding is masked out of the
softmax, not averaged in as zeros, and a token missing from every embedding gets a zero
vector).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import (
    ConfigError,
    check_flags,
    check_int,
    check_module_dtype,
    check_optional_int,
    check_tensor,
    found_on_host,
)
from attnlab.feature.multilevel import MaskedRNN
from attnlab.general._convention import AttentionCall, ConventionAttention, reject
from attnlab.general.attention import Attention
from attnlab.general.padding import zero_rows
from attnlab.output import AttentionOutput
from attnlab.registry import register

__all__ = ["CDME", "DME", "EmbeddingSpec", "MetaEmbedding"]

#: How one of the ``E`` embeddings is given to :class:`DME` / :class:`CDME`:
#: an int ``d_i`` (no table: the caller passes looked-up vectors ``[B, n, d_i]``),
#: a pair ``(vocab_size, d_i)`` (a fresh trainable ``nn.Embedding``), a tensor
#: ``[V_i, d_i]`` (pretrained vectors) or an ``nn.Embedding``.
EmbeddingSpec = int | tuple[int, int] | list[int] | Tensor | nn.Embedding


def _checked_mask(m: object, name: str, B: int, n: int) -> Tensor:
    """``m`` as a bool ``[B, n]`` mask, else a ``TypeError`` (not a bool tensor) or a
    ``ValueError`` (its shape) naming it."""
    if not isinstance(m, Tensor) or m.dtype != torch.bool:
        got = m.dtype if isinstance(m, Tensor) else type(m).__name__
        raise TypeError(f"{name} is {got}, expected a bool tensor [B, n] = [{B}, {n}]")
    if m.shape != (B, n):
        raise ValueError(f"{name} has shape {tuple(m.shape)}, expected bool [B, n] = [{B}, {n}]")
    return m


class MetaEmbedding(ConventionAttention):
    """Shared machinery of :class:`DME` and :class:`CDME`: the ``E`` embedding tables,
    their projections to the common size ``d_proj``, per-embedding OOV handling, and
    the query-less attention over the embeddings (``act="identity"`` by default: the
    linear score of the paper). Subclasses define :meth:`gate_keys` (the vectors the
    weights are scored from) and, where those are not of size ``d_proj``,
    :meth:`gate_size`. The arguments are :class:`DME`'s."""

    def __init__(
        self,
        embeddings: Sequence[EmbeddingSpec],
        d_proj: int,
        *,
        align: str = "soft",
        oov_index: int | Sequence[int | None] | None = None,
        freeze: bool = True,
        **options: Any,
    ) -> None:
        super().__init__()
        options.setdefault("act", "identity")
        if isinstance(embeddings, Tensor | nn.Module) or not isinstance(embeddings, Sequence):
            raise ConfigError("embeddings must be a list with one entry per embedding")
        if len(embeddings) < 1:
            raise ConfigError("embeddings is empty; a meta-embedding needs at least one")
        check_int(d_proj, "d_proj", wording="a positive int")
        check_flags(freeze=freeze)
        E = len(embeddings)
        one_index = oov_index is None or isinstance(oov_index, int)
        if one_index:
            oov = [oov_index] * E
        elif isinstance(oov_index, Sequence) and not isinstance(oov_index, str):
            oov = list(oov_index)
            if len(oov) != E:
                raise ConfigError(
                    f"oov_index has {len(oov)} entries, expected one per embedding ({E})"
                )
        else:
            raise TypeError(
                "oov_index must be an int, a list with one int (or None) per embedding, or "
                f"None, got {type(oov_index).__name__}"
            )
        for i, index in enumerate(oov):
            # an id (>= 0), or -1, the OOV id of every embedding anyway; True is not id 1
            check_optional_int(index, "oov_index" if one_index else f"oov_index[{i}]", minimum=-1)
        self.E = E
        self.d_proj = d_proj
        self.oov_index = oov
        self.tables = nn.ModuleList()
        self.has_table: list[bool] = []
        self.dims: list[int] = []
        for i, spec in enumerate(embeddings):
            table, dim = self._make_table(spec, i, freeze)
            self.has_table.append(table is not None)
            self.tables.append(table if table is not None else nn.Identity())
            self.dims.append(dim)
        self.proj = nn.ModuleList(nn.Linear(d, d_proj) for d in self.dims)
        self.gate_dim = self.gate_size()
        self.gate = Attention(
            score="queryless", align=align, d_k=self.gate_dim, d_v=d_proj, **options
        )

    @staticmethod
    def _make_table(spec: EmbeddingSpec, i: int, freeze: bool) -> tuple[nn.Embedding | None, int]:
        if isinstance(spec, nn.Embedding):
            return spec, spec.embedding_dim
        if isinstance(spec, Tensor):
            if spec.dim() != 2 or not spec.dtype.is_floating_point:
                raise ConfigError(
                    f"embeddings[{i}] has shape {tuple(spec.shape)} and dtype {spec.dtype}, "
                    "expected float pretrained vectors [V_i, d_i]"
                )
            return nn.Embedding.from_pretrained(spec, freeze=freeze), spec.shape[1]
        if isinstance(spec, bool):
            raise ConfigError(
                f"embeddings[{i}] is {spec!r}, expected an int, (V, d), a tensor or an nn.Embedding"
            )
        if isinstance(spec, int):
            if spec < 1:
                raise ConfigError(f"embeddings[{i}]: the size d_i must be positive, got {spec}")
            return None, spec
        if (
            isinstance(spec, tuple | list)
            and len(spec) == 2
            and all(isinstance(s, int) for s in spec)
        ):
            V, d = spec
            if V < 1 or d < 1:
                raise ConfigError(
                    f"embeddings[{i}] = {spec!r}: vocabulary size and d_i must be positive"
                )
            return nn.Embedding(V, d), d
        raise ConfigError(
            f"embeddings[{i}] is {type(spec).__name__}, expected an int d_i, a pair "
            "(vocab_size, d_i), a tensor [V_i, d_i] or an nn.Embedding"
        )

    # -------------------------------------------------------------- inputs

    def _lookup(
        self,
        inputs: Sequence[Tensor],
        masks: Sequence[Tensor | None] | None,
        token_mask: Tensor | None,
    ) -> tuple[list[Tensor], Tensor, int, int]:
        """Checked vectors ``[B, n, d_i]`` of every embedding, the availability
        ``[B, n, E]`` (OOV ids, ``masks`` and ``token_mask`` combined), ``B`` and ``n``."""
        self._check_lists(inputs, masks)
        B, n = self._batch_shape(inputs[0])
        vectors: list[Tensor] = []
        avail: list[Tensor] = []
        for i, x in enumerate(inputs):
            vec, ok = self._one_input(i, x, B, n)
            if masks is not None and masks[i] is not None:
                ok = ok & _checked_mask(masks[i], f"masks[{i}]", B, n)
            vectors.append(vec)
            avail.append(ok)
        dtype = vectors[0].dtype
        for i, v in enumerate(vectors):
            check_tensor(v, f"inputs[{i}]")
            if v.dtype != dtype:
                raise TypeError(f"inputs[{i}] gives dtype {v.dtype} but inputs[0] gives {dtype}")
            check_module_dtype(self, v, f"inputs[{i}]")
        A = torch.stack(avail, dim=-1)  # [B, n, E]
        if token_mask is not None:
            A = A & _checked_mask(token_mask, "mask", B, n)[..., None]
        return vectors, A, B, n

    def _check_lists(self, inputs: object, masks: object) -> None:
        if isinstance(inputs, Tensor) or not isinstance(inputs, Sequence):
            raise TypeError("inputs must be a list with one tensor per embedding")
        if len(inputs) != self.E:
            raise ValueError(
                f"inputs has {len(inputs)} tensors, expected one per embedding ({self.E})"
            )
        if masks is not None and (
            isinstance(masks, Tensor) or not isinstance(masks, Sequence) or len(masks) != self.E
        ):
            raise ValueError(
                f"masks must be a list of {self.E} bool tensors [B, n] (or None entries)"
            )

    @staticmethod
    def _batch_shape(x: object) -> tuple[int, int]:
        if not isinstance(x, Tensor):
            raise TypeError(f"inputs[0] must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 2:
            raise ValueError(
                f"inputs[0] has shape {tuple(x.shape)}, expected [B, n] ids or [B, n, d_0] vectors"
            )
        return x.shape[0], x.shape[1]

    def _one_input(self, i: int, x: object, B: int, n: int) -> tuple[Tensor, Tensor]:
        """``(vectors [B, n, d_i], available [B, n])`` of embedding ``i``."""
        if not isinstance(x, Tensor):
            raise TypeError(f"inputs[{i}] must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype.is_floating_point:
            if x.shape != (B, n, self.dims[i]):
                raise ValueError(
                    f"inputs[{i}] has shape {tuple(x.shape)}, expected vectors [B, n, d_{i}] = "
                    f"[{B}, {n}, {self.dims[i]}]"
                )
            return x, torch.ones(B, n, dtype=torch.bool, device=x.device)
        if x.dtype == torch.bool:
            raise TypeError(
                f"inputs[{i}] has dtype torch.bool, expected integer ids or float vectors"
            )
        if x.shape != (B, n):
            raise ValueError(
                f"inputs[{i}] has shape {tuple(x.shape)}, expected ids [B, n] = [{B}, {n}]"
            )
        return self._look_up_ids(i, x)

    def _look_up_ids(self, i: int, x: Tensor) -> tuple[Tensor, Tensor]:
        if not self.has_table[i]:
            raise ValueError(
                f"inputs[{i}] holds ids, but embedding {i} was declared by its size only; "
                f"pass vectors [B, n, {self.dims[i]}] or build it with a table"
            )
        table = self.tables[i]
        V = table.num_embeddings
        if found_on_host((x < -1) | (x >= V)):
            bad = x[(x < -1) | (x >= V)][0].item()
            raise ValueError(
                f"inputs[{i}] holds id {bad}, outside [-1, {V - 1}] (vocabulary size {V} "
                f"of embedding {i}; -1 marks an OOV token)"
            )
        ok = x != -1
        if self.oov_index[i] is not None:
            ok = ok & (x != self.oov_index[i])
        return table(x.clamp_min(0)), ok

    def project(self, vectors: Sequence[Tensor], available: Tensor) -> Tensor:
        """``x_ti = W_i x_i + b_i`` for every embedding, ``[B, n, E, d_proj]``; zero where
        embedding ``i`` is unavailable for the token. An unavailable vector never matters,
        whatever it holds: it is cleared with ``where`` before the projection (whose weight
        gradient would multiply it) and after it (``0 * NaN = NaN``)."""
        xt = torch.stack(
            [
                p(zero_rows(v, available[..., i]))
                for i, (p, v) in enumerate(zip(self.proj, vectors, strict=True))
            ],
            dim=2,
        )
        return torch.where(available[..., None], xt, xt.new_zeros(()))

    def gate_keys(self, xt: Tensor, available: Tensor, token_mask: Tensor | None) -> Tensor:
        """The vectors the weights are scored from, ``[B, n, E, gate_dim]``."""
        raise NotImplementedError

    def gate_size(self) -> int:
        """``gate_dim``, the size of :meth:`gate_keys`' vectors: ``d_proj`` (the
        projected embeddings themselves)."""
        return self.d_proj

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        """The call ``module(inputs, *, mask=None, masks=None, need_weights=False)``:
        ``query`` = the inputs (named ``inputs`` in messages), one tensor per embedding;
        the weights are self-attention over the embeddings of each token, so ``key`` and
        ``value`` are not taken. Deprecated for one release (``DeprecationWarning``):
        ``inputs=`` and ``token_mask=``."""
        owner = type(self).__name__
        call = self._renamed(call, extras, {"inputs": "query", "token_mask": "mask"})
        reject(owner, "key", call.key, "the embeddings of each token are its own keys")
        reject(owner, "value", call.value, "the projected embeddings are the values")
        if call.query is None:
            raise TypeError(
                f"{owner}.forward() missing the inputs: query, one tensor per embedding"
            )
        return call

    def _attend(
        self, call: AttentionCall, *, masks: Sequence[Tensor | None] | None = None
    ) -> AttentionOutput:
        """Meta-embed a batch of token sequences: ``call.query`` holds one tensor per
        embedding, ids ``[B, n]`` (looked up in that embedding's table; ``-1`` or the
        embedding's ``oov_index`` = OOV) or looked-up vectors ``[B, n, d_i]``;
        ``call.mask`` ``[B, n]`` bool is True at real tokens (padding gets a zero vector);
        ``masks`` is the optional per-embedding availability ``[B, n]`` bool (True = the
        token has this embedding), combined with the OOV ids.

        Returns :class:`~attnlab.output.AttentionOutput` with ``context`` ``[B, n, d_proj]``
        and, with ``need_weights=True``, ``weights`` ``[B, n, E]`` (0 for unavailable
        embeddings; all 0 for a token without any). ``extras["available"]`` is the
        ``[B, n, E]`` availability. With a stochastic alignment (``hard``,
        ``reinforced``) ``log_prob`` ``[B, n]`` is the log-probability of each token's
        draw (for :func:`~attnlab.general.alignment.reinforce_loss`).
        """
        need_weights = call.need_weights
        token_mask = call.mask
        vectors, A, B, n = self._lookup(call.query, masks, token_mask)
        xt = self.project(vectors, A)
        keys = self.gate_keys(xt, A, token_mask)
        N = B * n
        out = self.gate(
            None,
            keys.reshape(N, self.E, keys.shape[-1]),
            xt.reshape(N, self.E, self.d_proj),
            mask=A.reshape(N, self.E),
            need_weights=need_weights,
        )
        context = out.context.reshape(B, n, self.d_proj)
        weights = out.weights.reshape(B, n, self.E) if need_weights else None
        # a stochastic alignment: one draw per token, [B, n] (what trains the gate then)
        log_prob = None if out.log_prob is None else out.log_prob.reshape(B, n)
        return AttentionOutput(context, weights, log_prob, extras={"available": A})


@register("feature", "dme", aliases=("dynamic-meta-embeddings", "meta-embedding"))
class DME(MetaEmbedding):
    """Dynamic meta-embeddings (Kiela, Wang & Cho 2018).

    For each token, each of the ``E`` embeddings ``x_i`` (sizes ``d_i``, own vocabularies)
    is projected to the common size ``d'``, scored by a self-attentive (query-less) score
    and the projections are averaged with the resulting weights::

        x_ti    = W_i x_i + b_i                                   [d']
        alpha_i = softmax_i( w^T act(W x_ti + b) )  over the i available for the token
        x       = sum_i alpha_i x_ti

    Kiela et al. use the linear score ``a^T x_ti + b`` -- the default ``act="identity"``
    gives exactly that function class (``w^T (W x + b)`` is linear in ``x``); any other
    ``act``/``d_w`` gives the general query-less score, and ``align`` may be any alignment
    (``soft`` by default; ``sparsemax`` gives sparse weights). An embedding that is OOV
    for a token (id ``-1`` or its ``oov_index``, or False in its ``masks`` entry) is
    masked out: its weight is 0 and the others are renormalised; a token OOV in every
    embedding (or padding) gets the zero vector.

    Args:
        embeddings: one :data:`EmbeddingSpec` per embedding: ``d_i`` (vectors given at
            call time), ``(V_i, d_i)`` (a trainable table), a tensor ``[V_i, d_i]``
            (pretrained, frozen unless ``freeze=False``) or an ``nn.Embedding``.
        d_proj: the common size ``d'``.
        align: alignment over the embeddings (default ``soft``).
        oov_index: the id meaning "unknown" in each vocabulary (an int for all, or one
            per embedding, ``None`` = none; an id is an int ``>= -1``, not a bool);
            ``-1`` always means OOV. ``freeze`` must be a bool.
        **options: passed to the query-less score (``d_w``, ``act`` (default
            ``identity``), ``bias``) via :class:`attnlab.Attention`.

    Shapes: ``forward(inputs, *, mask=token_mask, masks=None)`` (``inputs`` is the
    convention's ``query``) with ``inputs[i]`` ids
    ``[B, n]`` or vectors ``[B, n, d_i]`` -> ``context`` ``[B, n, d']``, ``weights``
    ``[B, n, E]``. Cost: O(B n (sum_i d_i d' + E d' d_w)) time, O(B n E d') memory.
    Source: Kiela, Wang & Cho 2018, "Dynamic Meta-Embeddings for Improved Sentence
    Representations", EMNLP.

    :formula: x_ti = W_i x_i + b_i; alpha_i = softmax_i(w^T act(W x_ti + b)) over the embeddings
        i available for the token; x = sum_i alpha_i x_ti
    :source: Kiela, Wang & Cho 2018, Dynamic Meta-Embeddings for Improved Sentence
        Representations (EMNLP)
    :cost: O(B n (sum_i d_i d' + E d' d_w)) time, O(B n E d') memory
    """

    def gate_keys(self, xt: Tensor, available: Tensor, token_mask: Tensor | None) -> Tensor:
        return xt


@register("feature", "cdme", aliases=("contextualized-dme", "contextual-meta-embeddings"))
class CDME(MetaEmbedding):
    """Contextualized dynamic meta-embeddings (Kiela, Wang & Cho 2018).

    As :class:`DME`, but the weight of embedding ``i`` at token ``j`` is scored from the
    state of a BiLSTM run over embedding ``i``'s projected sequence, so it depends on the
    context::

        x_tij    = W_i x_ij + b_i
        h_ij     = BiLSTM(x_ti1, ..., x_tin)_j              (one BiLSTM shared by all i)
        alpha_ij = softmax_i( w^T act(W h_ij + b) )  over the i available at token j
        x_j      = sum_i alpha_ij x_tij

    The BiLSTM (``lstm_hidden`` units per direction) reads each embedding's sequence with
    the unavailable positions as zero vectors (their weights are masked out regardless)
    and only the real tokens (``token_mask``). OOV handling, ``align`` and ``**options``
    are those of :class:`DME` (default ``act="identity"``: the linear score
    ``a^T h_ij + b`` of the paper).

    Shapes: as :class:`DME`. Cost: O(B n (sum_i d_i d' + E (d' h + h^2) + E h d_w)) time,
    the BiLSTM runs sequentially over ``n``. Source: Kiela, Wang & Cho 2018, "Dynamic
    Meta-Embeddings for Improved Sentence Representations", EMNLP.

    :formula: x_tij = W_i x_ij + b_i; h_ij = BiLSTM(x_ti1..x_tin)_j; alpha_ij = softmax_i(w^T
        act(W h_ij + b)) over the embeddings available for token j; x_j = sum_i alpha_ij x_tij
    :source: Kiela, Wang & Cho 2018, Dynamic Meta-Embeddings for Improved Sentence
        Representations (EMNLP)
    :cost: O(B n (sum_i d_i d' + E (d' h + h^2) + E h d_w)) time, O(B n E (d' + h)) memory
    """

    def __init__(
        self,
        embeddings: Sequence[EmbeddingSpec],
        d_proj: int,
        *,
        lstm_hidden: int = 2,
        align: str = "soft",
        oov_index: int | Sequence[int | None] | None = None,
        freeze: bool = True,
        **options: Any,
    ) -> None:
        self.lstm_hidden = check_int(lstm_hidden, "lstm_hidden", wording="a positive int")
        super().__init__(
            embeddings, d_proj, align=align, oov_index=oov_index, freeze=freeze, **options
        )
        self.lstm = MaskedRNN(d_proj, lstm_hidden, cell="lstm", bidirectional=True)

    def gate_size(self) -> int:
        """The BiLSTM states: ``2 * lstm_hidden``."""
        return 2 * self.lstm_hidden

    def gate_keys(self, xt: Tensor, available: Tensor, token_mask: Tensor | None) -> Tensor:
        B, n, E, d = xt.shape
        seq = xt.permute(0, 2, 1, 3).reshape(B * E, n, d)
        if token_mask is None:
            tm = torch.ones(B * E, n, dtype=torch.bool, device=xt.device)
        else:
            tm = token_mask[:, None, :].expand(B, E, n).reshape(B * E, n)
        h = self.lstm(seq, tm)
        return h.reshape(B, E, n, h.shape[-1]).permute(0, 2, 1, 3)  # B may be 0
