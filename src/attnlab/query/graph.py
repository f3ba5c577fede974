"""Graph attention (Velickovic et al. 2018, GAT; Brody, Alon & Yahav 2022, GATv2): each
node attends over its neighbours in a graph (TAXONOMY section 4, "structured attention":
attention over a graph; the hierarchy half is
:class:`~attnlab.feature.multilevel.HierarchicalAttention`).

Self-attention over the nodes ``h_1 .. h_N`` in which the graph is the mask: node ``i``
may attend to node ``j`` only along an edge ``j -> i`` (``mask[b, i, j]`` True), and to
itself with ``self_loops=True``. Per head ``k`` (``N(i)``: the neighbours of ``i``)::

    v1 (GAT):    z_j = W^k h_j
                 e_ij = LeakyReLU_0.2(a_1^kT z_i + a_2^kT z_j)          j in N(i)
                 m_j = z_j
    v2 (GATv2):  e_ij = a^kT LeakyReLU_0.2(W_l^k h_i + W_r^k h_j)       j in N(i)
                 m_j = W_r^k h_j
    both:        alpha_ij = softmax_{j in N(i)} e_ij
                 h'_i = concat_k sum_j alpha^k_ij m^k_j    (concat=True)
                      = mean_k  sum_j alpha^k_ij m^k_j     (concat=False)
                 (+ bias)

**Composed from the general model.** Both scores are the registered additive score
``e = w^T act(W1 q + W2 k)`` (:class:`~attnlab.general.scoring.AdditiveScore`, no bias,
``act`` = LeakyReLU with slope 0.2), and each head is one
:class:`~attnlab.general.attention.Attention` with soft alignment whose mask is the
adjacency:

* v1 is the additive score with ``d_w = 1`` on the projected nodes ``q = z_i``,
  ``k = z_j``: ``W1 = a_1^T`` ``[1, d']``, ``W2 = a_2^T`` ``[1, d']``, and ``w`` (one
  number) is fixed to 1, a buffer. A trainable ``w`` would add nothing for ``w > 0``:
  LeakyReLU is positively homogeneous (``LeakyReLU(c x) = c LeakyReLU(x)`` for ``c > 0``),
  so ``w LeakyReLU(a_1^T z_i + a_2^T z_j) = LeakyReLU((w a_1)^T z_i + (w a_2)^T z_j)``, the
  GAT score with ``a`` scaled by ``w``; and a ``w < 0`` would give ``-LeakyReLU(.)``, which
  is no GAT score. With ``w = 1`` the paper's ``a = [a_1; a_2]`` is exactly ``(W1, W2)``.
* v2 is the additive score with ``d_w = d'`` on the raw nodes: ``W1 = W_l``, ``W2 = W_r``,
  ``w = a``; the messages reuse ``W2``: ``m_j = W2 h_j``.

The outer nonlinearity of the paper's layers (``sigma``, ELU in the hidden layers) is not
applied here: apply it to the output, as one applies an activation after a linear layer.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_choice, check_flags, check_int, check_number
from attnlab.general.attention import Attention
from attnlab.general.padding import attended_keys, clear_nonfinite_rows
from attnlab.general.scoring import AdditiveScore
from attnlab.output import AttentionOutput
from attnlab.query._convention import AttentionCall, HeadAttention
from attnlab.query.efficient import check_dropout
from attnlab.registry import register

__all__ = ["GraphAttention"]

#: the versions of the score: the paper of each
VERSIONS = ("v1", "v2")


def _unit_weight(score: AdditiveScore) -> AdditiveScore:
    """``score`` (``d_w = 1``) with its ``w`` replaced by the constant 1, a buffer: GAT's
    score ``LeakyReLU(a_1^T q + a_2^T k)`` with ``a_1 = W1``, ``a_2 = W2`` (see the module
    docstring for why a trainable ``w`` adds nothing)."""
    del score.w
    score.register_buffer("w", torch.ones(1))
    return score


def _adjacency(mask: Tensor, name: str, B: int, N: int, device: torch.device) -> Tensor:
    """The adjacency ``mask`` (bool, True = edge ``j -> i``) as ``[B or 1, N, N]``: a 2-D
    mask is ``[N, N]``, shared by the batch; a 3-D one broadcasts to ``[B, N, N]``."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} has dtype {mask.dtype}, expected torch.bool (the adjacency: "
            "mask[b, i, j] True = node i attends to node j)"
        )
    if mask.device != device:
        raise ValueError(f"{name} is on {mask.device} but the nodes are on {device}")
    m = mask[None] if mask.dim() == 2 else mask
    if m.dim() != 3 or any(s not in (1, w) for s, w in zip(m.shape, (B, N, N), strict=True)):
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)}, expected the adjacency [N, N] = [{N}, {N}] "
            f"or [B, N, N] = [{B}, {N}, {N}]"
        )
    return m


@register("query", "graph-attention", aliases=("gat", "graph-attention-network"))
class GraphAttention(HeadAttention):
    """Graph attention (GAT, Velickovic et al. 2018; GATv2, Brody et al. 2022): every node
    attends over its neighbours, the adjacency being the attention mask.

    Args:
        d_model: node feature size ``d_in``.
        num_heads: heads ``K`` (default 1).
        head_dim: the size ``d'`` of each head's output (default ``d_model // num_heads``
            with ``concat=True``, ``d_model`` with ``concat=False``: the output has
            ``d_model`` features either way).
        concat: concatenate the heads (``K d'`` features, the paper's hidden layers) or
            average them (``d'`` features, the paper's output layer).
        version: ``"v1"`` (GAT: ``e_ij = LeakyReLU(a^T [W h_i; W h_j])``) or ``"v2"``
            (GATv2: ``e_ij = a^T LeakyReLU(W_l h_i + W_r h_j)``, dynamic attention).
        self_loops: every node also attends to itself (the paper's ``N(i)`` holds ``i``).
        negative_slope: the LeakyReLU's slope (0.2, the papers').
        dropout: dropout on the attention coefficients (training only), as in the paper.
        bias: a learned bias added to the output (not in the papers' layer formula;
            ``bias=False`` gives exactly theirs).

    Call: ``forward(query, key=None, value=None, *, mask=None, causal=False,
    need_weights=False, average_weights=True, adjacency=None)``: ``query`` = the node
    features ``[B, N, d_model]`` (self-attention over the nodes: ``key`` / ``value`` must
    be ``None`` or ``query`` itself); ``mask`` = the adjacency, bool ``[N, N]`` (shared by
    the batch) or ``[B, N, N]``, ``mask[b, i, j]`` True = node ``i`` attends to node ``j``
    (an edge ``j -> i``); ``adjacency=`` is the same argument under its graph name (give
    one of the two). ``mask=None`` is the complete graph. ``causal=True`` is refused: a
    graph has no order (give ``mask & attnlab.masks.causal(N)`` for one).

    Returns :class:`~attnlab.output.AttentionOutput`: ``context`` ``[B, N, K d']``
    (``concat=True``) or ``[B, N, d']``, without the outer nonlinearity (apply
    ``F.elu`` to it, as the paper's layers do); ``weights`` (``need_weights=True``) the
    coefficients ``alpha`` averaged over the heads ``[B, N, N]`` (``average_weights=False``:
    ``[B, K, N, N]``), before dropout. A node with no neighbour (possible with
    ``self_loops=False``, e.g. padding) has zero weights and a zero aggregate, so its
    output is the bias alone (zero without ``bias``), never NaN, with finite gradients.

    Cost: dense, O(B K N^2 d') time for the scores (v1: O(B K N^2) once the nodes are
    projected) plus O(B N d_model K d') for the projections; memory O(B K N^2) (the
    chunked additive kernel never holds ``[B, N, N, d']``). Every pair is scored and the
    non-edges masked out: no sparse edge lists (for graphs of many nodes and few edges a
    sparse implementation is O(|E|)).

    :formula: v1: e_ij = LeakyReLU(a^T [W h_i; W h_j]), m_j = W h_j; v2: e_ij = a^T
        LeakyReLU(W_l h_i + W_r h_j), m_j = W_r h_j; alpha_ij = softmax over the neighbours j
        of i (the adjacency is the mask); h'_i = concat (or mean) over heads of sum_j alpha_ij
        m_j
    :source: Velickovic et al. 2018, Graph Attention Networks; Brody, Alon & Yahav 2022, How
        Attentive are Graph Attention Networks?
    :cost: O(B K N^2 d') dense (every pair scored, non-edges masked), memory O(B K N^2)
    """

    supports_cross = False
    supports_causal = False

    def __init__(
        self,
        d_model: int,
        num_heads: int = 1,
        head_dim: int | None = None,
        *,
        concat: bool = True,
        version: str = "v1",
        self_loops: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_choice(version, "version", VERSIONS)
        if isinstance(negative_slope, bool) or not isinstance(negative_slope, int | float):
            raise ConfigError(f"negative_slope must be a number, got {negative_slope!r}")
        check_number(negative_slope, "negative_slope")  # NaN would make every score NaN
        check_flags(concat=concat, self_loops=self_loops)
        if not concat and head_dim is None:
            head_dim = check_int(d_model, "d_model")
        hd = self._init_heads(d_model, num_heads, head_dim)
        self.concat, self.version, self.self_loops = concat, version, self_loops
        self.negative_slope = float(negative_slope)
        self.dropout = check_dropout(dropout)
        self.out_dim = num_heads * hd if concat else hd
        act = partial(F.leaky_relu, negative_slope=self.negative_slope)
        # v1: W of every head at once; the scores see the projected nodes (d_w = 1)
        self.proj = nn.Linear(d_model, num_heads * hd, bias=False) if version == "v1" else None
        d_in = hd if version == "v1" else d_model
        d_w = 1 if version == "v1" else hd
        heads = []
        for _ in range(num_heads):
            score = AdditiveScore(d_in, d_in, d_w, act=act, bias=False)
            if version == "v1":
                score = _unit_weight(score)
            heads.append(Attention(score, "soft", d_q=d_in, d_k=d_in, d_v=hd, dropout=self.dropout))
        self.heads = nn.ModuleList(heads)
        self.bias = nn.Parameter(torch.zeros(self.out_dim)) if bias else None
        if self.proj is not None:
            nn.init.xavier_uniform_(self.proj.weight)  # Glorot, as the paper

    def _mask(
        self, mask: Tensor | None, adjacency: Tensor | None, x: Tensor, eye: Tensor
    ) -> Tensor | None:
        """The mask of the call: the adjacency (given as ``mask`` or ``adjacency``) as
        ``[B or 1, N, N]``, with the self-loops (``eye``); ``None`` for the complete
        graph."""
        if mask is not None and adjacency is not None:
            raise TypeError(
                f"{type(self).__name__}.forward() got both mask and adjacency; give the "
                "adjacency once"
            )
        name = "mask" if adjacency is None else "adjacency"
        given = mask if adjacency is None else adjacency
        if given is None:
            return None
        B, N, _ = x.shape
        m = _adjacency(given, name, B, N, x.device)
        return m | eye if self.self_loops else m

    def _attend(self, call: AttentionCall, *, adjacency: Tensor | None = None) -> AttentionOutput:
        if call.causal:
            raise ValueError(
                "graph-attention does not support causal=True: a graph has no order; give "
                "the edges you want in the mask (e.g. mask & attnlab.masks.causal(N))"
            )
        x = call.query
        B, N, _ = x.shape
        eye = torch.eye(N, dtype=torch.bool, device=x.device)
        mask = self._mask(call.mask, adjacency, x, eye)
        if mask is not None:
            # a node no other node attends (padding) reaches no other output, but its
            # NaN / inf would (0 * NaN in the weighted sum and in the projections'
            # gradients): they are cleared; its finite features stay (its own output)
            others = mask & ~eye
            x = clear_nonfinite_rows(x, attended_keys(others))
        if self.proj is not None:
            z = self.proj(x).view(B, N, self.num_heads, self.head_dim)
            inputs = [(z[:, :, k], z[:, :, k]) for k in range(self.num_heads)]
        else:
            inputs = [(x, head.score.W2(x)) for head in self.heads]
        outs = [
            head(q, q, v, mask=mask, need_weights=call.need_weights)
            for head, (q, v) in zip(self.heads, inputs, strict=True)
        ]
        contexts = torch.stack([o.context for o in outs], dim=2)  # [B, N, K, d']
        context = contexts.flatten(2) if self.concat else contexts.mean(2)
        if self.bias is not None:
            # in the context's dtype: under autocast a float32 bias would promote it
            context = context + self.bias.to(context.dtype)
        weights = None
        if call.need_weights:
            weights = torch.stack([o.weights for o in outs], dim=1)  # [B, K, N, N]
            if call.average_weights:
                weights = weights.mean(1)
        return AttentionOutput(context, weights, path=outs[0].path)

    def extra_repr(self) -> str:
        return (
            f"version={self.version!r}, concat={self.concat}, self_loops={self.self_loops}, "
            f"out_dim={self.out_dim}"
        )
