"""Reformer's LSH attention (Kitaev, Kaiser & Levskaya 2020).

Shared-QK self-attention whose query ``i`` attends only to the keys hashed into its
bucket, found by sorting instead of by scoring all pairs:

1. **Shared QK.** Per head, ``q_i = W_q x_i`` and the key of position ``j`` is the
   normalised query ``k_j = q_j / ||q_j||``; the score is ``s_ij = q_i^T k_j / sqrt(d_head)``.
2. **Hashing** (angular LSH, ``n_buckets`` even). Per round ``r = 1..n_hashes`` a random
   rotation ``R_r`` ``[d_head, n_buckets / 2]`` gives ``h_r(x) = argmax([x R_r ; -x R_r])``.
3. **Sort** the positions by ``(bucket, position)`` and cut the sorted sequence into chunks
   of ``bucket_size`` positions.
4. **Chunked attention.** A query attends to the keys of its own chunk and of the previous
   chunk (the first chunk has none) that lie in its bucket (``P_i = {j : h(q_i) = h(k_j)}``;
   ``restrict_to_bucket=False`` drops that condition and keeps only the chunk window),
   that the mask allows and, with ``causal=True``, that are not in its future.
5. **No attention to self** unless nothing else: the score of ``j = i`` is replaced by
   ``-1e5`` (the query still may attend to itself, with a vanishing weight whenever it has
   another key).
6. **Rounds.** Round ``r`` gives ``o_r = sum_j softmax_j(s_ij) v_j`` and
   ``z_r = logsumexp_{j in P_r(i)} s_ij``; they combine as
   ``o = sum_r exp(z_r - logsumexp_r z_r) o_r`` -- one softmax over the rounds' key sets
   taken together, a key found in several rounds counting once per round. The paper's
   formula also subtracts ``log N_ij`` from each score (``N_ij``: the number of rounds
   whose set holds key ``j`` for query ``i``), so that a key counts once; attnlab leaves
   that correction out (a deliberate simplification: it needs the key sets of all rounds
   at once, and it changes nothing when every key is found in one round only).

With one bucket and ``bucket_size >= n`` every query sees every key: LSH attention is then
exactly full shared-QK attention without self-attention (tested).

Randomness: the rotations are drawn at every call from ``generator=`` (a forward keyword),
else from a generator seeded with ``seed`` (a constructor option: the same rotations at
every call), else from PyTorch's global RNG -- so ``torch.manual_seed`` makes a run
deterministic. With both ``seed`` and ``num_buckets`` they are the buffer ``rotations``
(moved with the module, in its ``state_dict``; the module then exports to ONNX).
``extras["buckets"]`` ``[B, h, n_hashes, n]`` and ``extras["rotations"]``
``[h, d_head, n_hashes, n_buckets / 2]`` record what was used.

Padding (the positions no query may attend under ``mask``) never matters, whatever it
holds: NaN and inf there are set to zero first, and padded positions are *sorted* as if
hashed to an extra last bucket, after every real position, so they never take a real
position's place in a chunk (``extras["buckets"]`` still records their hashes, and a padded
query row still compares its own hash with the keys'). The chunks of the real positions
are therefore those of the sequence without its padding: with a fixed ``num_buckets`` the
real outputs equal those of the unpadded sequence (with the default, ``num_buckets``
follows the padded length ``n``, which changes the hashing).

Shapes: ``query`` ``[B, n, d_model]`` (``key``/``value`` must be ``None`` or the query:
shared-QK attention is self-attention); ``mask`` bool broadcastable to ``[B, n, n]``, True
= may attend (a key padding mask ``[B, 1, n]`` costs nothing; a full ``[B, n, n]`` mask is
gathered per chunk). Output ``context`` ``[B, n, d_model]``; with ``need_weights`` the
effective weights ``[B, n, n]`` (the rounds combined, scattered into a dense matrix: O(n^2)
memory, only when asked).

Cost: hashing O(B h n_hashes n d_head n_buckets), sorting O(B h n_hashes n log n),
attention O(B h n_hashes n bucket_size d_head) time and O(B h n_hashes n bucket_size)
memory -- O(n log n) in the sequence length, chunk-limited memory instead of O(n^2).

Source: N. Kitaev, L. Kaiser, A. Levskaya. Reformer: The Efficient Transformer. ICLR 2020.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab._checks import ConfigError, check_flags, check_int
from attnlab.general.alignment import masked_softmax
from attnlab.general.padding import attended_keys, clear_nonfinite_rows
from attnlab.masks import fill_value, normalize_mask
from attnlab.output import AttentionOutput
from attnlab.query._convention import AttentionCall
from attnlab.query.efficient import (
    merge_heads,
    reduce_weights,
    split_heads,
)
from attnlab.query.multi_head import ProjectedHeadAttention
from attnlab.registry import register

__all__ = ["LSHAttention", "lsh_buckets"]


def lsh_buckets(x: Tensor, rotations: Tensor) -> Tensor:
    """Angular LSH: ``argmax([x R ; -x R])`` per round.

    ``x`` ``[B, h, n, d]``; ``rotations`` ``[h, d, rounds, n_buckets / 2]``. Returns the
    buckets ``[B, h, rounds, n]`` (int64, in ``[0, n_buckets)``)."""
    proj = torch.einsum("bhnd,hdrk->bhrnk", x, rotations)
    return torch.cat([proj, -proj], dim=-1).argmax(dim=-1)


def _self_score(dtype: torch.dtype) -> float:
    """The score that replaces ``s_ii``: very negative yet finite, so that a query with
    no other key still attends to itself."""
    return -1e5 if torch.finfo(dtype).max > 1e6 else -5e4


@register(
    "query",
    "reformer",
    aliases=("lsh", "lsh-attention"),
)
class LSHAttention(ProjectedHeadAttention):
    """Reformer LSH attention with several hash rounds.

    Args:
        d_model: model size; num_heads: heads ``h``; head_dim: per-head size (default
            ``d_model // num_heads``).
        bucket_size: the chunk length (and the target average bucket size).
        n_hashes: hash rounds.
        num_buckets: buckets per round (even, or ``1``); default: the number of chunks,
            ``ceil(n / bucket_size)``, rounded up to an even number (``1`` when there is
            one chunk).
        restrict_to_bucket: attend only to keys of the query's bucket (the paper's
            ``P_i``); ``False`` keeps only the chunk window.
        seed: draw the rotations from a generator seeded with this at every call (a fixed
            hash; with ``num_buckets`` too, once, as the buffer ``rotations``); ``None``
            (default) draws fresh rotations from the global RNG.
        dropout: dropout on the attention weights (training only); bias: biases in the
            projections.

    See the module docstring for the formula, shapes, randomness and cost.
    Source: Kitaev et al. 2020, Reformer: The Efficient Transformer (ICLR).

    :formula: shared QK (k_j = q_j/|q_j|); h(x) = argmax([xR; -xR]); sort by bucket, attend
        within chunk + previous chunk and bucket, not self; rounds combined with logsumexp
        weights
    :source: Kitaev et al. 2020, Reformer: The Efficient Transformer
    :cost: O(B h n_hashes n (bucket_size d_head + log n)) time, O(B h n_hashes n bucket_size)
        memory
    """

    supports_cross = False
    supports_causal = True

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        bucket_size: int = 64,
        n_hashes: int = 2,
        num_buckets: int | None = None,
        restrict_to_bucket: bool = True,
        seed: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        # W_q is the shared query/key projection
        super().__init__(
            d_model, num_heads, head_dim, inputs=("q", "v"), dropout=dropout, bias=bias
        )
        self.bucket_size = check_int(bucket_size, "bucket_size")
        self.n_hashes = check_int(n_hashes, "n_hashes")
        if num_buckets is not None:
            check_int(num_buckets, "num_buckets")
            if num_buckets > 1 and num_buckets % 2:
                raise ConfigError(
                    f"num_buckets must be 1 or even (angular LSH hashes to [xR; -xR]), "
                    f"got {num_buckets}"
                )
        self.num_buckets = num_buckets
        check_flags(restrict_to_bucket=restrict_to_bucket)
        self.restrict_to_bucket = restrict_to_bucket
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed must be an int or None, got {seed!r}")
        self.seed = seed
        # the seeded rotations, drawn once per shape, seed, device and dtype (not state)
        self._seeded: tuple[tuple[Any, ...], Tensor] | None = None
        # with a seed and num_buckets, one shape serves every call: a buffer, so that
        # module.to() moves it, a checkpoint holds it and an exported graph holds it as a
        # constant (torch.onnx cannot hold a seeded torch.Generator's draw)
        self.rotations: Tensor | None
        self._buffer_key: tuple[int | None, tuple[int, ...] | None] = (seed, None)
        if seed is not None and num_buckets is not None:
            shape = self._rotation_shape(num_buckets)
            rot = self._seeded_draw(seed, shape).to(torch.get_default_device())
            self.register_buffer("rotations", rot)
            self._buffer_key = (seed, shape)
        else:
            self.rotations = None

    # ------------------------------------------------------------------ hashing

    def buckets_for(self, n: int) -> int:
        """The number of buckets per round for a sequence of length ``n``."""
        if self.num_buckets is not None:
            return self.num_buckets
        chunks = max(1, math.ceil(n / self.bucket_size))
        return 1 if chunks == 1 else chunks + chunks % 2

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # a checkpoint saved before the rotations were a buffer: the seed makes them
        key = prefix + "rotations"
        if self.rotations is not None and key not in state_dict:
            state_dict[key] = self._seeded_draw(*self._buffer_key)  # type: ignore[arg-type]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _rotation_shape(self, n_buckets: int) -> tuple[int, int, int, int]:
        return (self.num_heads, self.head_dim, self.n_hashes, max(n_buckets // 2, 1))

    @staticmethod
    def _seeded_draw(seed: int, shape: tuple[int, ...]) -> Tensor:
        """The rotations of ``seed``: drawn on the CPU in float32 (a CUDA generator draws
        other numbers), whatever the default device."""
        g = torch.Generator().manual_seed(seed)
        return torch.randn(shape, generator=g, device="cpu", dtype=torch.float32)

    def draw_rotations(
        self, n_buckets: int, like: Tensor, generator: torch.Generator | None = None
    ) -> Tensor:
        """Random rotations ``[h, d_head, n_hashes, n_buckets / 2]`` (standard normal).

        With ``seed`` they are drawn on the CPU and moved to ``like``'s device, so a seeded
        module hashes alike on every device. With ``seed`` and ``num_buckets`` they are the
        buffer ``rotations``, drawn at construction (``reset_parameters`` draws them
        again); with ``seed`` alone they are drawn and copied once per shape and device,
        not at every call (a copy from the host waits for the device)."""
        shape = self._rotation_shape(n_buckets)
        buffered = self.rotations
        if generator is None and buffered is not None and self._buffer_key == (self.seed, shape):
            # (a seed or num_buckets changed after construction falls to the cache below)
            return buffered.to(like.dtype, copy=True)  # the caller's own copy
        if generator is None and self.seed is not None:
            key = (shape, self.seed, like.device, like.dtype)
            if self._seeded is None or self._seeded[0] != key:
                rot = self._seeded_draw(self.seed, shape)
                self._seeded = (key, rot.to(device=like.device, dtype=like.dtype))
            return self._seeded[1].clone()  # the caller may keep and change its copy
        device = like.device if generator is None else generator.device
        rot = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        return rot.to(device=like.device, dtype=like.dtype)

    def _chunk(
        self, q: Tensor, v: Tensor, buckets: Tensor, nb: int, real: Tensor | None = None
    ) -> _Chunks:
        """Sort the positions of every round by (bucket, position), pad them to whole
        chunks (padded positions hash to an extra last bucket, sorted last) and cut them
        into chunks that each see themselves and the previous chunk. The positions where
        ``real`` (``[B or 1, n]``) is False are sorted as if in that last bucket too."""
        B, H, n, _ = q.shape
        R, c = self.n_hashes, self.bucket_size
        n_pad = math.ceil(n / c) * c
        pad = n_pad - n
        n_chunks = n_pad // c
        sort_key = buckets
        if real is not None:  # padding sorts after every real position
            sort_key = torch.where(real[:, None, None, :], buckets, nb)
        # padded even when ``pad`` is 0: a traced graph then serves every length, not
        # only those of the traced length's parity
        q, v = F.pad(q, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        buckets = F.pad(buckets, (0, pad), value=nb)
        sort_key = F.pad(sort_key, (0, pad), value=nb)
        pos = torch.arange(n_pad, device=q.device)
        order = (sort_key * n_pad + pos).argsort(dim=-1)  # [B, h, R, n_pad]

        def gather(x: Tensor) -> Tensor:  # [B, h, n_pad, d] -> [B, h, R, n_pad, d] sorted
            idx = order[..., None].expand(*order.shape, x.shape[-1])
            return x[:, :, None].expand(B, H, R, n_pad, x.shape[-1]).gather(3, idx)

        def chunks(x: Tensor) -> Tensor:  # [..., n_pad(, d)] -> [..., nc, c(, d)]
            return x.reshape(B, H, R, n_chunks, c, *x.shape[4:])

        def look_back(x: Tensor) -> Tensor:  # chunk t sees chunks t-1 and t
            return torch.cat([x.roll(1, dims=3), x], dim=4)

        sq = gather(q)
        sk = sq / sq.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # shared QK: normalised
        sbkt = buckets.gather(-1, order)
        cq, ck = chunks(sq), look_back(chunks(sk))
        scores = (cq @ ck.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        return _Chunks(
            order=order,
            undo=order.argsort(dim=-1),
            scores=scores,  # [B, h, R, nc, c, 2c]
            values=look_back(chunks(gather(v))),
            qpos=chunks(order)[..., :, None],
            kpos=look_back(chunks(order))[..., None, :],
            qbucket=chunks(sbkt)[..., :, None],
            kbucket=look_back(chunks(sbkt))[..., None, :],
        )

    def _allowed(self, ch: _Chunks, n: int, m3: Tensor | None, causal: bool) -> Tensor:
        """Which (query, key) pairs of the chunks may attend: not padding, not the missing
        chunk before the first, the same bucket (``restrict_to_bucket``), the past
        (``causal``) and the user's mask."""
        B, _, _, n_chunks, c, _ = ch.scores.shape
        qp, kp = ch.qpos, ch.kpos
        allowed = kp < n  # not padding
        first = torch.zeros(n_chunks, 2 * c, dtype=torch.bool, device=kp.device)
        first[0, :c] = True  # the first chunk has no previous chunk
        allowed = allowed & ~first[:, None, :]
        if self.restrict_to_bucket:
            allowed = allowed & (ch.qbucket == ch.kbucket)
        if causal:
            allowed = allowed & (kp <= qp)
        if m3 is None:
            return allowed
        pad = ch.order.shape[-1] - n
        bidx = torch.arange(B, device=kp.device).view(B, 1, 1, 1, 1, 1)
        if m3.shape[1] == 1:  # a key mask: gathered per key, O(n) extra memory
            key_ok = F.pad(m3[:, 0, :].expand(B, n), (0, pad), value=False)
            return allowed & key_ok[bidx, kp]
        # a full [B, n, n] mask: gathered per (query, key) pair of the chunks
        mb = F.pad(m3.expand(B, n, n), (0, pad, 0, pad), value=False)
        return allowed & mb[bidx, qp.expand_as(ch.scores), kp.expand_as(ch.scores)]

    # ------------------------------------------------------------------ forward

    def _attend(
        self, call: AttentionCall, *, generator: torch.Generator | None = None
    ) -> AttentionOutput:
        query, mask, causal = call.query, call.mask, call.causal
        need_weights, average_weights = call.need_weights, call.average_weights
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        B, n, _ = query.shape
        m3 = normalize_mask(mask, B, n, n, device=query.device)
        H, R, dh = self.num_heads, self.n_hashes, self.head_dim
        nb = self.buckets_for(n)
        # NaN / inf in the padded positions (no query may attend them) are cleared (where)
        # before the projections: they can reach neither the outputs nor the gradients
        real = None if m3 is None else attended_keys(m3)
        x = query if real is None else clear_nonfinite_rows(query, real)
        q = split_heads(self.q_proj(x), H)  # [B, h, n, d]
        v = split_heads(self.v_proj(x), H)
        rotations = self.draw_rotations(nb, query, generator)
        if nb > 1:
            buckets = lsh_buckets(q.detach(), rotations)  # [B, h, R, n]
        else:
            buckets = torch.zeros(B, H, R, n, dtype=torch.long, device=query.device)
        extras = {"buckets": buckets, "rotations": rotations, "num_buckets": nb}
        if n == 0:
            out = self.out_proj(query.new_zeros(B, 0, H * dh))
            w = query.new_zeros(B, H, 0, 0) if need_weights else None
            return AttentionOutput(
                out, reduce_weights(w, average_weights), path="lsh", extras=extras
            )

        ch = self._chunk(q, v, buckets, nb, real)
        allowed = self._allowed(ch, n, m3, causal)
        scores = ch.scores.masked_fill(ch.kpos == ch.qpos, _self_score(ch.scores.dtype))
        a = masked_softmax(scores, allowed)  # per round, per chunk
        # a query without an allowed key in a round gets -inf, selected after a finite
        # logsumexp (of -inf everywhere, it would have a NaN gradient: harmless once masked,
        # but torch.autograd.detect_anomaly stops at it)
        lse = torch.where(
            allowed.any(-1),
            scores.masked_fill(~allowed, fill_value(scores.dtype)).logsumexp(-1),
            float("-inf"),
        )  # [B, h, R, nc, c]
        p = self.dropout if self.training else 0.0
        o = (F.dropout(a, p, True) if p > 0 else a) @ ch.values  # [B, h, R, nc, c, d]

        # back to the original order, then combine the rounds
        B, H, R, n_pad = ch.order.shape
        o = o.reshape(B, H, R, n_pad, dh)
        o = o.gather(3, ch.undo[..., None].expand(B, H, R, n_pad, dh))
        lse = lse.reshape(B, H, R, n_pad).gather(3, ch.undo)
        found = torch.isfinite(lse)
        round_w = masked_softmax(lse.masked_fill(~found, 0.0), found, dim=2)  # over rounds
        context = (round_w[..., None] * o).sum(2)[:, :, :n]  # [B, h, n, d]
        out = self.out_proj(merge_heads(context))
        weights = None
        if need_weights:
            weights = reduce_weights(_dense_weights(ch, a, round_w, n), average_weights)
        return AttentionOutput(out, weights, path="lsh", extras=extras)


@dataclass(frozen=True)
class _Chunks:
    """The sorted, chunked view of one call (see :meth:`LSHAttention._chunk`)."""

    order: Tensor  # [B, h, R, n_pad]: sorted position -> original position
    undo: Tensor  # its inverse permutation
    scores: Tensor  # [B, h, R, nc, c, 2c]
    values: Tensor  # [B, h, R, nc, 2c, d]
    qpos: Tensor  # [B, h, R, nc, c, 1]: original positions of the queries
    kpos: Tensor  # [B, h, R, nc, 1, 2c]: original positions of the keys
    qbucket: Tensor
    kbucket: Tensor


def _dense_weights(ch: _Chunks, a: Tensor, round_w: Tensor, n: int) -> Tensor:
    """Every round's chunk weights (times its round weight) scattered into ``[B, h, n,
    n]``."""
    B, H, R, n_pad = ch.order.shape
    n_chunks, c = a.shape[3], a.shape[4]
    rw_sorted = round_w.gather(3, ch.order).reshape(B, H, R, n_chunks, c)
    vals = (a * rw_sorted[..., None]).flatten(2)  # flatten, not reshape(B, H, -1): B may be 0
    flat = (ch.qpos * n_pad + ch.kpos).expand_as(a).flatten(2)
    dense = a.new_zeros(B, H, n_pad * n_pad).scatter_add_(2, flat, vals)
    return dense.view(B, H, n_pad, n_pad)[:, :, :n, :n]
