"""Pointer networks (Vinyals, Fortunato & Jaitly 2015): the attention distribution *is*
the output.

An encoder LSTM reads the input points ``P = (P_1, ..., P_n)`` into states ``e_1..e_n``;
a decoder LSTM produces a state ``d_i`` at every output step, and the output at step ``i``
is a pointer to one of the inputs, drawn from the attention over the encoder states:

    u^i_j = v^T tanh(W1 e_j + W2 d_i)              j = 1..n (the paper's additive score)
    p(C_i = j | C_1..C_{i-1}, P) = softmax_j(u^i)  over the allowed positions j

The decoder's input at step ``i`` is the (embedded) input point chosen at step ``i - 1``
(a learned start vector at step 1); its initial state is the encoder's final state.

Allowed positions: real inputs (padding of ragged input sets is masked via ``lengths`` or
``mask``), minus the positions already chosen when ``mask_chosen=True`` (the output is
then a subset in some order, e.g. a permutation), plus, with ``eos=True``, an
end-of-sequence pointer. The end pointer is a learned key vector placed *after* the
(padded) inputs: with inputs ``[B, n, d_in]`` the distribution has ``n + 1`` entries and
index ``n`` means "stop" (see :meth:`PointerNetwork.eos_index`).

The score is any query-dependent score of :mod:`attnlab.general.scoring` (``score=`` name
or module, options by name); the paper's additive score ``v^T tanh(W1 e_j + W2 d_i)``
(without bias) is the default. In attnlab's naming the decoder state is the query ``q`` and
the encoder states are the keys ``k``: ``u_j = w^T tanh(W1 q + W2 k_j)`` (so the paper's
``W1`` is attnlab's ``W2`` and vice versa).

Training uses teacher forcing: :meth:`PointerNetwork.forward` takes the target index
sequences and returns the log-probabilities of every step; :func:`pointer_loss` is the
negative log-likelihood. Decoding: :meth:`PointerNetwork.greedy` and
:meth:`PointerNetwork.beam_search` (beam width ``k``, vectorised over the batch).

Cost (``n`` inputs, ``T`` output steps, hidden size ``h``, score width ``d_w``): the LSTMs
O(B (n + T) h^2); the pointer scores O(B T n d_w) time with the additive score's chunked
kernel (memory O(B T n), never ``[B, T, n, d_w]``). Teacher forcing runs the decoder over
all steps in one LSTM call; greedy decoding takes ``T`` sequential steps, beam search the
same ``T`` steps over ``B k`` beams (time O(B k T (h^2 + n d_w)), memory O(B k (n + T))).
At each decoding step the score module is called on the whole key set, so the key-side
projection of the additive score (the paper's ``W1 e_j``, attnlab's ``W2 k_j``) is
recomputed per step: + O(B T n h d_w).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import (
    ConfigError,
    check_flags,
    check_int,
    check_module_dtype,
    check_tensor,
    found_on_host,
    is_traced,
)
from attnlab._recurrent import bound_rnn_weights, padded_rnn, stepped_rnn
from attnlab.general.padding import zero_rows
from attnlab.general.scoring import Score
from attnlab.masks import fill_value, index_mask
from attnlab.output import output_pytree
from attnlab.registry import Configurable, build, get, register

__all__ = [
    "IGNORE_INDEX",
    "PointerDecoding",
    "PointerNetwork",
    "PointerOutput",
    "masked_log_softmax",
    "pointer_loss",
]

#: Padding value of target and decoded index sequences (after the end of a sequence).
IGNORE_INDEX = -1


def masked_log_softmax(e: Tensor, allowed: Tensor | None, dim: int = -1) -> Tensor:
    """``log softmax`` of ``e`` over the positions where ``allowed`` is True; disallowed
    positions get ``-inf`` (probability 0). A slice with no allowed position is all
    ``-inf``. Gradients reach only the allowed positions and are finite."""
    if allowed is None:
        return torch.log_softmax(e, dim)
    x = e.masked_fill(~allowed, fill_value(e.dtype))
    return torch.log_softmax(x, dim).masked_fill(~allowed, float("-inf"))


def pointer_loss(
    log_probs: Tensor,
    targets: Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    reduction: str = "mean",
) -> Tensor:
    """Negative log-likelihood of the target pointers under teacher forcing.

    Args:
        log_probs: ``[B, T, N]`` log-probabilities (``PointerOutput.log_probs``).
        targets: ``[B, T]`` target indices in ``[0, N)``; ``ignore_index`` marks steps after
            the end of a sequence, which do not count.
        reduction: ``"mean"`` (per counted pointer), ``"sum"``, or ``"none"`` (the negative
            log-likelihood of each sequence, ``[B]``).
    """
    check_tensor(log_probs, "log_probs")
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs has shape {tuple(log_probs.shape)}, expected [B, T, N]")
    targets = _check_targets(targets, log_probs.shape[0], log_probs.shape[2], ignore_index)
    if targets.shape[1] != log_probs.shape[1]:
        raise ValueError(
            f"targets has shape {tuple(targets.shape)}, expected [B, T] = "
            f"[{log_probs.shape[0]}, {log_probs.shape[1]}] (the steps of log_probs)"
        )
    keep = targets != ignore_index
    picked = log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    nll = -torch.where(keep, picked, torch.zeros_like(picked))
    if reduction == "none":
        return nll.sum(1)
    if reduction == "sum":
        return nll.sum()
    if reduction == "mean":
        return nll.sum() / keep.sum().clamp(min=1)
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _check_targets(targets: Tensor, batch: int, n: int, ignore_index: int) -> Tensor:
    if not isinstance(targets, Tensor):
        raise TypeError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise TypeError(f"targets has dtype {targets.dtype}, expected an integer dtype")
    if targets.dim() != 2 or targets.shape[0] != batch:
        raise ValueError(
            f"targets has shape {tuple(targets.shape)}, expected [B, T] = [{batch}, T]"
        )
    targets = targets.long()
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= n))
    if found_on_host(bad):
        b, t = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"targets[{b}, {t}] = {int(targets[b, t])} is not a position in [0, {n}) nor the "
            f"padding value {ignore_index}"
        )
    return targets


@output_pytree()
@dataclass
class PointerOutput:
    """Teacher-forced pass of a pointer network.

    Attributes:
        log_probs: ``[B, T, N]`` log-probabilities of pointing at each position at each
            step (``-inf`` where not allowed). ``N = n`` (``n + 1`` with an end pointer).
            In float32 for half-precision inputs (the dtype scores are computed in), as
            ``torch.autocast`` keeps ``log_softmax``: a loss summed over steps in bfloat16
            would lose the small differences training needs; the same for the two below.
        target_log_prob: ``[B, T]`` log-probability of each target pointer (0 at padding).
        sequence_log_prob: ``[B]`` log-probability of each whole target sequence.
        allowed: ``[B, T, N]`` bool, the positions each step could point at.
        decoder_states: ``[B, T, h]`` the decoder states ``d_i`` (the queries).
        keys: ``[B, N, h]`` the encoder states ``e_j`` (and the end key) the pointer scores.
    """

    log_probs: Tensor
    target_log_prob: Tensor
    sequence_log_prob: Tensor
    allowed: Tensor
    decoder_states: Tensor
    keys: Tensor

    @property
    def probs(self) -> Tensor:
        """``[B, T, N]`` the pointer distributions (0 where not allowed)."""
        return self.log_probs.exp()


@output_pytree()
@dataclass
class PointerDecoding:
    """Decoded pointer sequences.

    Attributes:
        indices: ``[B, T]`` (greedy) or ``[B, k, T]`` (beam search, best first) pointer
            sequences, padded with ``-1`` after their end (the end pointer, when the network
            has one, is included).
        log_prob: ``[B]`` or ``[B, k]`` the log-probability of each sequence (beams sorted
            in descending order; ``-inf`` for beams that hold no valid sequence, which
            happens when fewer than ``k`` sequences exist).
        lengths: ``[B]`` or ``[B, k]`` the number of pointers in each sequence.
    """

    indices: Tensor
    log_prob: Tensor
    lengths: Tensor


@dataclass
class _Encoded:
    embedded: Tensor  # [B, n, d_e]
    keys: Tensor  # [B, N, h]
    state: tuple[Tensor, Tensor]  # ([L, B, h], [L, B, h])
    allowed: Tensor  # [B, N] bool
    lengths: Tensor  # [B] long


@register("query", "pointer-network", aliases=("ptr-net", "pointer"))
class PointerNetwork(Configurable):
    """Pointer network: an LSTM encoder-decoder whose output at each step is its attention
    distribution over the inputs (Vinyals et al. 2015).

    Args:
        d_in: size of an input element (2 for planar points).
        d_hidden: LSTM hidden size ``h`` (encoder and decoder).
        d_embed: the inputs are embedded by a linear map ``[d_in] -> [d_embed]`` before the
            LSTMs (default ``d_hidden``); the decoder's input is the embedding of the
            previously chosen input.
        num_layers: LSTM layers.
        score: a query-dependent score name (``additive`` by default, the paper's
            ``v^T tanh(W1 e_j + W2 d_i)``; also ``general``, ``dot``, ``scaled-dot``,
            ``cosine``, ...) or a :class:`~attnlab.general.scoring.Score` module with
            ``d_q = d_k = d_hidden``.
        mask_chosen: forbid pointing twice at the same input (output = an ordered subset).
        eos: add an end-of-sequence pointer at index ``n`` (variable-length outputs).
        **options: passed to the score by name (``d_w``, ``act``, ``bias``, ``temperature``).
            For the additive score ``bias`` defaults to ``False`` (the paper has none) and
            ``d_w`` to ``d_hidden``.

    Shapes: ``x`` ``[B, n, d_in]``; ``lengths`` ``[B]`` (int) or ``mask`` ``[B, n]`` (bool,
    True = real input; padding must come last); targets ``[B, T]`` (long, ``-1`` pads).

    Cost: see the module docstring.

    :formula: u^i_j = v^T tanh(W1 e_j + W2 d_i); p(C_i = j | C_<i, P) = softmax_j(u^i) over the
        allowed positions j
    :source: Vinyals, Fortunato & Jaitly 2015, Pointer Networks
    :cost: LSTMs O(B (n + T) h^2); scores O(B T n d_w) time, O(B T n) memory; beam search O(B k
        T (h^2 + n d_w))
    """

    def __init__(
        self,
        d_in: int,
        d_hidden: int = 128,
        *,
        d_embed: int | None = None,
        num_layers: int = 1,
        score: str | Score = "additive",
        mask_chosen: bool = True,
        eos: bool = False,
        **options: Any,
    ) -> None:
        super().__init__()
        for name, value in (("d_in", d_in), ("d_hidden", d_hidden), ("num_layers", num_layers)):
            check_int(value, name)
        d_embed = check_int(d_hidden if d_embed is None else d_embed, "d_embed")
        self.d_in, self.d_hidden, self.d_embed = d_in, d_hidden, d_embed
        self.num_layers = num_layers
        check_flags(mask_chosen=mask_chosen, eos=eos)
        self.mask_chosen, self.eos = mask_chosen, eos
        self.embed = nn.Linear(d_in, d_embed)
        self.encoder = nn.LSTM(d_embed, d_hidden, num_layers, batch_first=True)
        self.decoder = nn.LSTM(d_embed, d_hidden, num_layers, batch_first=True)
        self._encoder_weights = bound_rnn_weights(self, "encoder")
        self._decoder_weights = bound_rnn_weights(self, "decoder")
        self.start = nn.Parameter(torch.empty(d_embed).uniform_(-0.1, 0.1))
        if self.eos:
            self.eos_key = nn.Parameter(torch.empty(d_hidden).uniform_(-0.1, 0.1))
        else:
            self.register_parameter("eos_key", None)
        self.score = self._build_score(score, d_hidden, options)

    @staticmethod
    def _build_score(score: str | Score, h: int, options: dict[str, Any]) -> Score:
        if isinstance(score, Score):
            if options:
                raise TypeError(
                    f"options {sorted(options)} were given with a Score module; set them on "
                    "the module instead"
                )
            module = score
        elif isinstance(score, str):
            entry = get("score", score)
            cfg = {"name": entry.name, "kind": "score", "d_q": h, "d_k": h, **options}
            if entry.name == "additive":
                cfg.setdefault("bias", False)
                cfg.setdefault("d_w", h)
            module = build(cfg)  # unknown options raise TypeError naming them
        else:
            raise ConfigError(f"score must be a name or a Score module, got {type(score).__name__}")
        if not module.needs_query:
            raise ConfigError(
                f"a pointer network scores the inputs against the decoder state, but score "
                f"{getattr(module, 'registry_name', type(module).__name__)!r} is query-less"
            )
        if getattr(module, "vector", False):
            raise ConfigError("a pointer network needs one score per input, not a vector score")
        return module

    # ------------------------------------------------------------------ helpers

    def eos_index(self, n: int) -> int | None:
        """The index of the end pointer for inputs padded to ``n`` elements (``None``
        without one)."""
        return n if self.eos else None

    def _check_input(
        self, x: Tensor, lengths: Tensor | None, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        check_tensor(x, "x")
        if x.dim() != 3 or x.shape[-1] != self.d_in:
            raise ValueError(
                f"x has shape {tuple(x.shape)}, expected [B, n, d_in] = [B, n, {self.d_in}]"
            )
        check_module_dtype(self, x, "x")
        B, n, _ = x.shape
        if lengths is not None and mask is not None:
            raise ValueError("give lengths or mask, not both")
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                what = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
                raise TypeError(f"mask is {what}, expected a torch.bool tensor [B, n]")
            if tuple(mask.shape) != (B, n):
                raise ValueError(
                    f"mask has shape {tuple(mask.shape)}, expected [B, n] = [{B}, {n}]"
                )
            lengths = mask.sum(1)
            prefix = torch.arange(n, device=mask.device)[None, :] < lengths[:, None]
            if found_on_host(prefix != mask):
                raise ValueError(
                    "mask must mark a prefix of each row (real inputs first, padding last): "
                    "the encoder LSTM reads the inputs in order"
                )
        if lengths is None:
            lengths = torch.full((B,), n, dtype=torch.long, device=x.device)
        else:
            if not isinstance(lengths, Tensor):
                lengths = torch.as_tensor(lengths, device=x.device)
            if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
                raise TypeError(f"lengths has dtype {lengths.dtype}, expected an integer dtype")
            if tuple(lengths.shape) != (B,):
                raise ValueError(f"lengths has shape {tuple(lengths.shape)}, expected [B] = [{B}]")
            lengths = lengths.to(device=x.device, dtype=torch.long)
            bad = (lengths < 0) | (lengths > n)
            if found_on_host(bad):
                raise ValueError(f"lengths must lie in [0, n] = [0, {n}], got {lengths.tolist()}")
        allowed = torch.arange(n, device=x.device)[None, :] < lengths[:, None]
        return lengths, allowed

    def encode(
        self, x: Tensor, *, lengths: Tensor | None = None, mask: Tensor | None = None
    ) -> _Encoded:
        """Run the encoder: embeddings, keys ``[B, N, h]`` (the encoder states, then the end
        key), the decoder's initial state and the allowed positions ``[B, N]``."""
        lengths, allowed = self._check_input(x, lengths, mask)
        B, n, _ = x.shape
        L, h = self.num_layers, self.d_hidden
        # padding never matters: cleared (where) before the embedding, whose weight
        # gradient would multiply it even though the packed encoder never reads it
        emb = self.embed(zero_rows(x, allowed))
        if n == 0 or B == 0:
            enc = emb.new_zeros(B, n, h)
            state = (emb.new_zeros(L, B, h), emb.new_zeros(L, B, h))
        elif is_traced():  # dynamo traces neither nn.LSTM nor packing; vmap no packing
            enc, state = stepped_rnn(
                self._encoder_weights, emb, lengths.clamp(min=1), training=self.training
            )
        elif bool((lengths == n).all()):
            enc, state = self.encoder(emb)
        else:
            packed = nn.utils.rnn.pack_padded_sequence(
                emb, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
            )
            out, state = self.encoder(packed)
            enc, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=n)
        if self.eos:
            enc = torch.cat([enc, self.eos_key.expand(B, 1, h)], 1)
            allowed = torch.cat([allowed, allowed.new_ones(B, 1)], 1)
        return _Encoded(emb, enc, state, allowed, lengths)

    def point(self, queries: Tensor, keys: Tensor, allowed: Tensor | None = None) -> Tensor:
        """The pointer distribution: ``log softmax_j score(d_i, e_j)`` over the allowed
        positions.

        Args:
            queries: decoder states ``[B, T, h]``.
            keys: encoder states ``[B, N, h]``.
            allowed: bool broadcastable to ``[B, T, N]`` (True = may point there).

        Returns ``[B, T, N]`` log-probabilities, ``-inf`` where not allowed.
        """
        e = self.score(queries, keys)
        if allowed is not None:
            if allowed.dtype != torch.bool:
                raise TypeError(f"allowed has dtype {allowed.dtype}, expected torch.bool")
            try:
                ok = torch.broadcast_shapes(allowed.shape, e.shape) == e.shape
            except RuntimeError:
                ok = False
            if not ok:
                raise ValueError(
                    f"allowed has shape {tuple(allowed.shape)}, expected a shape broadcastable "
                    f"to [B, T, N] = {list(e.shape)}"
                )
        return masked_log_softmax(e, allowed)

    def _start(self, rows: int, dtype: torch.dtype) -> Tensor:
        """The learned first decoder input ``[rows, 1, d_embed]`` in ``dtype``, the dtype of
        the embedded inputs (under :func:`torch.autocast` the LSTM needs one dtype: a
        float32 start beside bfloat16 embeddings would fail inside the CPU LSTM kernel)."""
        return self.start.to(dtype).expand(rows, 1, self.d_embed)

    def _gather_inputs(self, emb: Tensor, idx: Tensor) -> Tensor:
        """Embeddings of the chosen inputs ``idx`` ``[B, T]`` (any value outside the real
        inputs -- padding, the end pointer -- reads position 0; it is never used)."""
        n = emb.shape[1]
        if n == 0:
            return emb.new_zeros(*idx.shape, emb.shape[2])
        safe = torch.where((idx >= 0) & (idx < n), idx, torch.zeros_like(idx))
        return emb.gather(1, safe.unsqueeze(-1).expand(*safe.shape, emb.shape[2]))

    # ------------------------------------------------------------------ training

    def forward(
        self,
        x: Tensor,
        targets: Tensor,
        *,
        lengths: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> PointerOutput:
        """Teacher forcing: the decoder reads the target pointers' inputs and returns the
        log-probabilities of every step.

        ``targets`` ``[B, T]``: indices in ``[0, n)`` (``n`` is the end pointer when
        ``eos=True``), padded with ``-1`` after the end. A target that points at padding or
        (with ``mask_chosen``) at a position already chosen, or a pointer after the end
        (after a ``-1`` or the end pointer), raises ``ValueError``.
        """
        enc = self.encode(x, lengths=lengths, mask=mask)
        B, n = x.shape[:2]
        N = enc.keys.shape[1]
        targets = _check_targets(targets, B, N, IGNORE_INDEX)
        T = targets.shape[1]
        prev = self._gather_inputs(enc.embedded, targets[:, :-1])
        inputs = torch.cat([self._start(B, prev.dtype), prev], 1)
        if T == 0:
            dec = x.new_zeros(B, 0, self.d_hidden)
        elif B == 0:
            dec = x.new_zeros(0, T, self.d_hidden)
        elif is_traced():
            dec = padded_rnn(self._decoder_weights, inputs, state=enc.state, training=self.training)
        else:
            dec, _ = self.decoder(inputs, enc.state)
        allowed = enc.allowed[:, None, :].expand(B, T, N)
        if self.mask_chosen and n > 0:
            real = (targets >= 0) & (targets < n)
            onehot = index_mask(targets, N) & real[..., None]
            before = (onehot.cumsum(1) - onehot.long()) > 0  # chosen at an earlier step
            allowed = allowed & ~before
        counted = targets != IGNORE_INDEX
        ended = ~counted
        if self.eos:
            ended = ended | (targets == n)
        after_end = (ended.long().cumsum(1) - ended.long()) > 0  # a step after an end
        if found_on_host(after_end & counted):
            b, t = (int(i) for i in (after_end & counted).nonzero()[0])
            raise ValueError(
                f"targets[{b}, {t}] = {int(targets[b, t])} comes after the end of the sequence "
                f"(a -1 pad{' or the end pointer ' + str(n) if self.eos else ''}); pad with -1 "
                "after the end"
            )
        ok = allowed.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) | ~counted
        if found_on_host(~ok):
            b, t = (int(i) for i in (~ok).nonzero()[0])
            why = "padding" if int(targets[b, t]) >= int(enc.lengths[b]) else "already chosen"
            raise ValueError(
                f"targets[{b}, {t}] = {int(targets[b, t])} points at a position that is not "
                f"allowed at that step ({why})"
            )
        log_probs = self.point(dec, enc.keys, allowed)
        picked = log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        target_lp = torch.where(counted, picked, torch.zeros_like(picked))
        return PointerOutput(log_probs, target_lp, target_lp.sum(1), allowed, dec, enc.keys)

    def loss(
        self,
        x: Tensor,
        targets: Tensor,
        *,
        lengths: Tensor | None = None,
        mask: Tensor | None = None,
        reduction: str = "mean",
    ) -> Tensor:
        """Teacher-forced negative log-likelihood (see :func:`pointer_loss`)."""
        out = self(x, targets, lengths=lengths, mask=mask)
        return pointer_loss(out.log_probs, targets, reduction=reduction)

    # ------------------------------------------------------------------ decoding

    def _max_steps(self, n: int, max_steps: int | None) -> int:
        if max_steps is None:
            return n + 1 if self.eos else n
        return check_int(max_steps, "max_steps", 0, error=ValueError)

    def _advance(
        self,
        choice: Tensor,
        live: Tensor,
        allowed: Tensor,
        count: Tensor,
        finished: Tensor,
        lengths: Tensor,
        n: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Book-keeping after a step: ``choice`` ``[...]`` (``-1`` for finished rows), the
        rows still decoding ``live``; returns the new ``allowed``, ``count``, ``finished``."""
        is_point = live & (choice >= 0) & (choice < n)
        if self.mask_chosen and n > 0:
            hit = index_mask(choice, allowed.shape[-1])
            allowed = allowed & ~(hit & is_point[..., None])
        count = count + live.long()
        if self.eos:
            finished = finished | (live & (choice == n))
        else:
            finished = finished | (count >= lengths)
        return allowed, count, finished

    def greedy(
        self,
        x: Tensor,
        *,
        lengths: Tensor | None = None,
        mask: Tensor | None = None,
        max_steps: int | None = None,
    ) -> PointerDecoding:
        """Greedy decoding: point at the most probable allowed position at every step.

        A sequence ends at the end pointer (``eos=True``) or, without one, after as many
        pointers as it has real inputs. ``max_steps`` caps the length (default ``n + 1``
        with an end pointer, else ``n``). Returns :class:`PointerDecoding` with
        ``indices`` ``[B, T]``.
        """
        enc = self.encode(x, lengths=lengths, mask=mask)
        B, n = x.shape[:2]
        T = self._max_steps(n, max_steps)
        allowed = enc.allowed.clone()
        lengths_ = enc.lengths
        finished = torch.zeros(B, dtype=torch.bool, device=x.device)
        if not self.eos:
            finished = lengths_ == 0
        count = torch.zeros(B, dtype=torch.long, device=x.device)
        total = x.new_zeros(B)
        state = enc.state
        inp = self._start(B, enc.embedded.dtype)
        picks: list[Tensor] = []
        for _ in range(T):
            if B == 0 or bool(finished.all()):
                break
            dec, state = self.decoder(inp, state)
            lp = self.point(dec, enc.keys, allowed[:, None, :]).squeeze(1)  # [B, N]
            choice = lp.argmax(-1)
            step = lp.gather(-1, choice[:, None]).squeeze(-1)
            live = ~finished
            total = total + torch.where(live, step, torch.zeros_like(step))
            choice = torch.where(live, choice, torch.full_like(choice, IGNORE_INDEX))
            picks.append(choice)
            allowed, count, finished = self._advance(
                choice, live, allowed, count, finished, lengths_, n
            )
            inp = self._gather_inputs(enc.embedded, choice[:, None])
        indices = (
            torch.stack(picks, 1)
            if picks
            else torch.full((B, 0), IGNORE_INDEX, dtype=torch.long, device=x.device)
        )
        return PointerDecoding(indices, total, count)

    def beam_search(
        self,
        x: Tensor,
        beam_width: int = 4,
        *,
        lengths: Tensor | None = None,
        mask: Tensor | None = None,
        max_steps: int | None = None,
    ) -> PointerDecoding:
        """Beam search with ``beam_width`` beams per example, vectorised over the batch.

        At every step each live beam is extended by every allowed position, a finished beam
        only by itself (its log-probability unchanged), and the ``k`` best of the ``k (N + 1)``
        candidates of each example are kept. The score of a sequence is its log-probability
        (no length normalisation). Returns :class:`PointerDecoding` with ``indices``
        ``[B, k, T]`` and ``log_prob`` ``[B, k]``, best first. ``beam_width=1`` is greedy
        decoding. When ``k`` is at least the number of possible sequences the search is
        exhaustive (exact).
        """
        k = check_int(beam_width, "beam_width", error=ValueError)
        enc = self.encode(x, lengths=lengths, mask=mask)
        B, n = x.shape[:2]
        N = enc.keys.shape[1]
        T = self._max_steps(n, max_steps)
        dev = x.device
        neg_inf = float("-inf")
        allowed = enc.allowed[:, None, :].expand(B, k, N).clone()
        lengths_ = enc.lengths[:, None].expand(B, k)
        finished = torch.zeros(B, k, dtype=torch.bool, device=dev)
        if not self.eos:
            finished = (lengths_ == 0).clone()
        count = torch.zeros(B, k, dtype=torch.long, device=dev)
        score = x.new_zeros(B, k)
        score[:, 1:] = neg_inf  # one live beam at the start: no duplicates
        L = self.num_layers
        h0, c0 = enc.state
        state = tuple(
            s[:, :, None, :].expand(L, B, k, self.d_hidden).reshape(L, B * k, self.d_hidden)
            for s in (h0, c0)
        )
        seqs = torch.full((B, k, 0), IGNORE_INDEX, dtype=torch.long, device=dev)
        inp = self._start(B * k, enc.embedded.dtype)
        for t in range(T):
            if B == 0 or bool(finished.all()):
                break
            dec, state = self.decoder(inp, state)
            lp = self.point(dec.reshape(B, k, self.d_hidden), enc.keys, allowed)  # [B, k, N]
            lp = lp.masked_fill(finished[..., None], neg_inf)
            stay = torch.where(finished, 0.0, neg_inf).to(lp.dtype)[..., None]
            cand = score[..., None] + torch.cat([lp, stay], -1)  # [B, k, N + 1]
            score, flat = cand.reshape(B, k * (N + 1)).topk(k, dim=-1)
            beam = torch.div(flat, N + 1, rounding_mode="floor")
            tok = flat % (N + 1)
            allowed = allowed.gather(1, beam[..., None].expand(B, k, N))
            # a beam with no valid sequence (fewer than k exist) is finished as well
            finished = finished.gather(1, beam) | torch.isneginf(score)
            count = count.gather(1, beam)
            seqs = seqs.gather(1, beam[..., None].expand(B, k, t))
            idx = beam[None, :, :, None].expand(L, B, k, self.d_hidden)
            state = tuple(
                s.reshape(L, B, k, self.d_hidden).gather(2, idx).reshape(L, B * k, -1)
                for s in state
            )
            live = ~finished
            choice = torch.where(live & (tok < N), tok, torch.full_like(tok, IGNORE_INDEX))
            seqs = torch.cat([seqs, choice[..., None]], -1)
            allowed, count, finished = self._advance(
                choice, live, allowed, count, finished, lengths_, n
            )
            inp = self._gather_inputs(enc.embedded, choice).reshape(B * k, 1, self.d_embed)
        dead = torch.isinf(score) & (score < 0)
        seqs = seqs.masked_fill(dead[..., None], IGNORE_INDEX)
        count = count.masked_fill(dead, 0)
        order = score.argsort(dim=-1, descending=True, stable=True)
        score = score.gather(1, order)
        seqs = seqs.gather(1, order[..., None].expand_as(seqs))
        count = count.gather(1, order)
        return PointerDecoding(seqs, score, count)
