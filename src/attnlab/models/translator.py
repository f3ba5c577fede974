"""Sequence-to-sequence translator with attention, in the styles of Bahdanau et al. (2015)
and Luong et al. (2015), with the attention swappable.

Encoder (both styles): embeddings and a bidirectional LSTM/GRU with ``hidden_size / 2``
units per direction, so the encoder states ``h_1..h_S`` and the decoder state have the same
size ``d = hidden_size`` (the dot score needs that). The decoder starts from
``s_0 = tanh(W_b [h_fwd_S; h_bwd_1])`` (the final states of the two directions).

Bahdanau style (``style="bahdanau"``; additive score by default)::

    e_{t,l} = score(s_{t-1}, h_l);  a_t = align(e_t);  c_t = sum_l a_{t,l} h_l
    s_t = RNN([E y_{t-1}; c_t], s_{t-1})
    logits_t = W_y tanh(W_o [s_t; c_t; E y_{t-1}])

Luong style (``style="luong"``; general score by default; input feeding on by default)::

    s_t = RNN([E y_{t-1}; h~_{t-1}], s_{t-1})           (h~_0 = 0; without input feeding
                                                           the input is E y_{t-1} alone)
    e_{t,l} = score(s_t, h_l);  a_t = align(e_t);  c_t = sum_l a_{t,l} h_l
    h~_t = tanh(W_c [c_t; s_t]);  logits_t = W_y h~_t

The attention is :class:`attnlab.Attention` with any registered score (``dot``, ``general``,
``additive``/``concat``, ``scaled-dot``, ``biased-general``, ``cosine``, ...) and alignment
(``soft`` = global, ``local-m``, ``local-p`` with window ``D``, ``sparsemax``, ...). For
local-m the window centre of output step ``t`` is ``p_t = t``. Baselines: ``"mean"``
(``c_t`` = the mean of the encoder states, no attention parameters) and ``"uniform"`` (the
attention module kept, its weights replaced by ``1/S``).

Sources: Bahdanau, Cho & Bengio 2015, "Neural Machine Translation by Jointly Learning to
Align and Translate", ICLR; Luong, Pham & Manning 2015, "Effective Approaches to
Attention-based Neural Machine Translation", EMNLP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_flags, check_int, check_number, is_traced
from attnlab._recurrent import bound_rnn_weights, rnn_step
from attnlab.general.alignment import LocalMAlign
from attnlab.general.attention import Attention
from attnlab.models._decoder import decoder_attention, greedy_search, teacher_forcing
from attnlab.models._inputs import (
    check_choice,
    check_dropout,
    check_ids,
    check_index,
    check_lengths,
    check_sizes,
)
from attnlab.models._pooling import uniform_context, uniform_weights
from attnlab.models._rnn import run_packed
from attnlab.output import output_pytree
from attnlab.registry import Configurable, register

__all__ = [
    "Encoded",
    "Seq2SeqTranslator",
    "Translation",
    "TranslatorOutput",
    "sequence_log_prob",
]

STYLES = ("bahdanau", "luong")
BASELINES = ("mean", "uniform")
_DEFAULT_SCORE = {"bahdanau": "additive", "luong": "general"}


@output_pytree()
@dataclass
class TranslatorOutput:
    """Teacher-forced result: ``logits`` ``[B, T, V]``, attention ``weights`` ``[B, T, S]``
    (zero on source padding), and for stochastic alignments the summed ``log_prob``
    ``[B]`` of the choices sampled at the real target steps (a step whose input is
    ``pad_idx`` is padding: its sample counts for nothing; else None)."""

    logits: Tensor
    weights: Tensor
    log_prob: Tensor | None = None


@dataclass
class Encoded:
    """Encoder result: ``states`` ``[B, S, d]`` (zero on padding), ``mask`` ``[B, S]``
    bool (True = real token), ``init`` the decoder's initial hidden ``[B, d]``."""

    states: Tensor
    mask: Tensor
    init: Tensor


@dataclass
class Translation:
    """Decoded output per example: ``tokens`` (ids, without BOS/EOS), ``attention``
    (``[len(tokens), S_i]`` weights over the real source tokens, one row per generated
    token), ``score`` (the sum of the tokens' log-probabilities, EOS included when it was
    generated; beam search ranks by ``score / lp`` with the length penalty ``lp``)."""

    tokens: list[list[int]]
    attention: list[Tensor]
    scores: list[float] = field(default_factory=list)


@register("model", "translator", aliases=("seq2seq", "nmt"))
class Seq2SeqTranslator(Configurable):
    """Encoder-decoder translator with attention (see the module docstring).

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        embed_dim: ``d_e``. hidden_size: ``d`` (even; ``d/2`` per encoder direction).
        rnn: ``"lstm"`` or ``"gru"`` (encoder and decoder).
        style: ``"bahdanau"`` or ``"luong"``.
        attention: ``None`` (the style's default score with soft alignment), a score
            name, a dict ``{"score": ..., "align": ..., **options}`` passed to
            :class:`attnlab.Attention` (e.g. ``{"align": "local-p", "D": 4}``; ``"uniform":
            True`` gives the uniform baseline of that attention), or ``"mean"`` /
            ``"uniform"``.
        input_feeding: Luong's input feeding (ignored for Bahdanau).
        dropout: on the embeddings and before the output layer (training only).
        pad_idx, bos_idx, eos_idx: special target ids (source padding is ``pad_idx`` too).

    Shapes: ``forward(src [B, S], src_lengths [B], tgt_in [B, T])`` ->
    :class:`TranslatorOutput` (``logits [B, T, V]``, ``weights [B, T, S]``). ``tgt_in``
    starts with BOS (the gold target shifted right). ``greedy_decode`` and
    ``beam_search`` return :class:`Translation`.

    Cost: encoder O(B S d (d_e + d)) sequential in S; each decoder step O(B d (d_e + d))
    plus the attention, O(B S d) for global attention (additive O(B S d d_w)), O(B D d) for
    local; output layer O(B T d V).

    :formula: s_t = RNN(...); c_t = sum_l align(score(s, h_l)) h_l; Bahdanau: query s_{t-1}, c_t
        into the RNN; Luong: query s_t, h~_t = tanh(W_c [c_t; s_t]), input feeding
    :source: Bahdanau et al. 2015, Neural Machine Translation by Jointly Learning to Align and
        Translate; Luong et al. 2015, Effective Approaches to Attention-based Neural Machine
        Translation
    :cost: encoder O(B S d (d_e + d)); decoder per step O(B d (d_e + d)) + attention O(B S d)
        (global) or O(B D d) (local); output O(B T d V)
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        *,
        embed_dim: int = 64,
        hidden_size: int = 64,
        rnn: str = "lstm",
        style: str = "luong",
        attention: str | dict[str, Any] | None = None,
        input_feeding: bool = True,
        dropout: float = 0.0,
        pad_idx: int = 0,
        bos_idx: int = 2,
        eos_idx: int = 3,
    ) -> None:
        super().__init__()
        check_sizes(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size)
        check_sizes(embed_dim=embed_dim, hidden_size=hidden_size)
        if hidden_size % 2:
            raise ConfigError(f"hidden_size must be even (d/2 per direction), got {hidden_size}")
        check_choice(style, "style", STYLES)
        check_choice(rnn, "rnn", ("lstm", "gru"))
        check_dropout(dropout)
        check_index(
            tgt_vocab_size, "tgt_vocab_size", pad_idx=pad_idx, bos_idx=bos_idx, eos_idx=eos_idx
        )
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.pad_idx, self.bos_idx, self.eos_idx = pad_idx, bos_idx, eos_idx
        self.style, self.rnn_type = style, rnn
        check_flags(input_feeding=input_feeding)
        self.input_feeding = input_feeding and style == "luong"
        d = hidden_size
        self.d = d
        cell = nn.LSTM if rnn == "lstm" else nn.GRU
        self.src_embedding = nn.Embedding(src_vocab_size, embed_dim, padding_idx=pad_idx)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, embed_dim, padding_idx=pad_idx)
        self.encoder = cell(embed_dim, d // 2, batch_first=True, bidirectional=True)
        self._encoder_weights = bound_rnn_weights(self, "encoder")
        self.bridge = nn.Linear(d, d)
        self.dropout = nn.Dropout(dropout)
        self.attention: Attention | None
        self.attention, self.uniform = decoder_attention(attention, d, _DEFAULT_SCORE[style], d_w=d)
        # local-m centres the window of output step t on p_t = t
        self.local_m = self.attention is not None and isinstance(self.attention.align, LocalMAlign)

        if style == "bahdanau":
            self.decoder = cell(embed_dim + d, d, batch_first=True)
            self.pre_output = nn.Linear(2 * d + embed_dim, d)
        else:
            self.decoder = cell(embed_dim + (d if self.input_feeding else 0), d, batch_first=True)
            self.combine = nn.Linear(2 * d, d, bias=False)  # W_c
        self._decoder_weights = bound_rnn_weights(self, "decoder")
        self.output = nn.Linear(d, tgt_vocab_size)

    # ------------------------------------------------------------------ encoder

    def _check(self, src: Tensor, src_lengths: Tensor | None) -> Tensor:
        check_ids(src, self.src_vocab_size, name="src", layout="[B, S]")
        B, S = src.shape
        if src_lengths is None:
            return torch.full((B,), S, dtype=torch.long, device=src.device)
        return check_lengths(
            src_lengths, (B,), ("S", S), name="src_lengths", tokens=src, tokens_name="src"
        )

    def encode(self, src: Tensor, src_lengths: Tensor | None = None) -> Encoded:
        """Encoder states ``[B, S, d]`` (zero on padding), the mask and ``s_0``."""
        lengths = self._check(src, src_lengths)
        B, S = src.shape
        mask = torch.arange(S, device=src.device)[None, :] < lengths[:, None]
        x = self.dropout(self.src_embedding(src)) * mask[..., None]
        if B == 0 or S == 0:
            states = x.new_zeros(B, S, self.d)
            return Encoded(states, mask, torch.tanh(self.bridge(x.new_zeros(B, self.d))))
        states = run_packed(self._encoder_weights, x, lengths, training=self.training)
        # the final states of the one-layer encoder are outputs: going forward the last
        # real step's, going backward step 0's (what the packed run returns as h_n)
        half = self.d // 2
        at_end = (lengths - 1).clamp(min=0)[:, None, None].expand(B, 1, half)
        forward_last = states[..., :half].gather(1, at_end).squeeze(1)
        last = torch.cat([forward_last, states[:, 0, half:]], -1) * (lengths > 0)[:, None]
        states = states * mask[..., None]
        return Encoded(states, mask, torch.tanh(self.bridge(last)))

    # ------------------------------------------------------------------ decoder step

    def init_state(self, enc: Encoded) -> dict[str, Tensor]:
        """The decoder state before the first step (a dict of ``[N, ...]`` tensors)."""
        h = enc.init
        state = {"h": h, "step": torch.zeros(h.shape[0], dtype=torch.long, device=h.device)}
        if self.rnn_type == "lstm":
            state["c"] = torch.zeros_like(h)
        if self.input_feeding:
            state["feed"] = torch.zeros_like(h)
        return state

    def _attend(self, query: Tensor, enc: Encoded, step: Tensor) -> tuple[Tensor, Tensor, Any]:
        """Context ``[N, d]``, weights ``[N, S]`` and log_prob of one decoder step."""
        mask = enc.mask
        if self.attention is None or self.uniform:
            w = uniform_weights(mask, enc.states.dtype)
            return uniform_context(self.attention, w, enc.states), w, None
        positions = step.to(enc.states.dtype)[:, None] if self.local_m else None
        out = self.attention(query, enc.states, mask=mask, need_weights=True, positions=positions)
        return out.context, out.weights, out.log_prob

    def _rnn(self, x: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        if is_traced():  # Dynamo refuses the nn.LSTM / nn.GRU: the same weights, ATen's cell
            h1, c1 = rnn_step(self._decoder_weights, x, state["h"], state.get("c"))
            return h1, ({"h": h1} if c1 is None else {"h": h1, "c": c1})
        h = state["h"][None].contiguous()
        if self.rnn_type == "lstm":
            out, (h1, c1) = self.decoder(x[:, None, :], (h, state["c"][None].contiguous()))
            new = {"h": h1[0], "c": c1[0]}
        else:
            out, h1 = self.decoder(x[:, None, :], h)
            new = {"h": h1[0]}
        return out[:, 0], new

    def decode_step(
        self, y_prev: Tensor, state: dict[str, Tensor], enc: Encoded
    ) -> tuple[Tensor, dict[str, Tensor], Tensor, Any]:
        """One decoder step: ``y_prev`` ``[N]`` ids -> logits ``[N, V]``, the new state,
        the attention weights ``[N, S]`` and the alignment's log_prob (or None)."""
        emb = self.dropout(self.tgt_embedding(y_prev))
        step = state["step"]
        if self.style == "bahdanau":
            context, weights, log_prob = self._attend(state["h"], enc, step)
            s, new = self._rnn(torch.cat([emb, context], -1), state)
            hidden = torch.tanh(self.pre_output(torch.cat([s, context, emb], -1)))
        else:
            x = torch.cat([emb, state["feed"]], -1) if self.input_feeding else emb
            s, new = self._rnn(x, state)
            context, weights, log_prob = self._attend(s, enc, step)
            hidden = torch.tanh(self.combine(torch.cat([context, s], -1)))
            if self.input_feeding:
                new["feed"] = hidden
        new["step"] = step + 1
        logits = self.output(self.dropout(hidden))
        return logits, new, weights, log_prob

    # ------------------------------------------------------------------ training

    def decode(self, enc: Encoded, tgt_in: Tensor) -> TranslatorOutput:
        """Teacher-forced decoding of ``tgt_in`` ``[B, T]`` (BOS first)."""
        if tgt_in.dim() != 2 or tgt_in.shape[0] != enc.states.shape[0]:
            raise ValueError(
                f"tgt_in has shape {tuple(tgt_in.shape)}, expected [B, T] with B = "
                f"{enc.states.shape[0]}"
            )
        logits, weights, log_prob = teacher_forcing(
            lambda y, state: self.decode_step(y, state, enc),
            self.init_state(enc),
            tgt_in,
            enc.states,
            self.tgt_vocab_size,
            enc.mask.shape[1],
        )
        if log_prob is not None:  # the samples of the real steps, not of the padding
            log_prob = log_prob.masked_fill(tgt_in == self.pad_idx, 0.0).sum(1)
        return TranslatorOutput(logits, weights, log_prob)

    def forward(self, src: Tensor, src_lengths: Tensor | None, tgt_in: Tensor) -> TranslatorOutput:
        """Teacher forcing: logits ``[B, T, V]`` and weights ``[B, T, S]``."""
        return self.decode(self.encode(src, src_lengths), tgt_in)

    # ------------------------------------------------------------------ inference

    def log_probs(self, logits: Tensor) -> Tensor:
        """Decoding distribution: ``log_softmax`` of ``logits`` ``[..., V]`` with PAD and
        BOS excluded (a decoder never emits them)."""
        banned = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        banned[[self.pad_idx, self.bos_idx]] = True
        x = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return torch.log_softmax(x.masked_fill(banned, float("-inf")), -1)

    @staticmethod
    def _select(state: dict[str, Tensor], idx: Tensor) -> dict[str, Tensor]:
        return {k: v.index_select(0, idx) for k, v in state.items()}

    @staticmethod
    def _select_enc(enc: Encoded, idx: Tensor) -> Encoded:
        return Encoded(
            enc.states.index_select(0, idx),
            enc.mask.index_select(0, idx),
            enc.init.index_select(0, idx),
        )

    @torch.no_grad()
    def greedy_decode(
        self, src: Tensor, src_lengths: Tensor | None = None, max_len: int = 50
    ) -> Translation:
        """Pick the most probable token at every step until EOS or ``max_len`` tokens."""
        enc = self.encode(src, src_lengths)
        tokens, rows, scores = greedy_search(
            lambda y, state: self.decode_step(y, state, enc),
            self.init_state(enc),
            torch.full((src.shape[0],), self.bos_idx, dtype=torch.long, device=src.device),
            self.eos_idx,
            max_len,
            self.log_probs,
        )
        lengths = enc.mask.sum(1).tolist()
        attention = [r[:, : lengths[b]] for b, r in enumerate(rows)]
        return Translation(tokens, attention, scores)

    @torch.no_grad()
    def beam_search(
        self,
        src: Tensor,
        src_lengths: Tensor | None = None,
        *,
        beam_size: int = 5,
        max_len: int = 50,
        length_penalty: float = 0.0,
    ) -> Translation:
        """Beam search per example.

        Hypotheses are ranked by ``sum log p / lp`` with ``lp = ((5 + |y|) / 6) ** alpha``
        (Wu et al. 2016; ``alpha = length_penalty``, 0 = plain log-probability). At every
        step the ``2k`` best expansions are ranked; an expansion ending in EOS that ranks
        among the first ``k`` is finished, the first ``k`` others stay alive. The search
        stops when ``k`` hypotheses are finished or after ``max_len`` tokens (the alive ones
        then count as finished). ``beam_size=1`` is greedy decoding.
        """
        check_int(beam_size, "beam_size", 1, error=ValueError)
        check_int(max_len, "max_len", 1, error=ValueError)
        # a NaN length penalty ranked no hypothesis above another
        check_number(length_penalty, "length_penalty", low=0, error=ValueError)
        enc_all = self.encode(src, src_lengths)
        lengths = enc_all.mask.sum(1).tolist()
        out = Translation([], [], [])
        for b in range(src.shape[0]):
            toks, rows, score = self._beam_one(
                self._select_enc(enc_all, torch.tensor([b], device=src.device)),
                beam_size,
                max_len,
                length_penalty,
            )
            out.tokens.append(toks)
            att = (
                torch.stack(rows)[:, : lengths[b]]
                if rows
                else enc_all.states.new_zeros(0, lengths[b])
            )
            out.attention.append(att)
            out.scores.append(score)
        return out

    @staticmethod
    def _lp(length: int, alpha: float) -> float:
        return ((5.0 + length) / 6.0) ** alpha if alpha else 1.0

    def _beam_one(
        self, enc: Encoded, k: int, max_len: int, alpha: float
    ) -> tuple[list[int], list[Tensor], float]:
        device = enc.states.device
        state = self.init_state(enc)
        # alive hypotheses: (tokens, attention rows, summed log-prob)
        alive: list[tuple[list[int], list[Tensor], float]] = [([], [], 0.0)]
        finished: list[tuple[float, list[int], list[Tensor], float]] = []
        for _ in range(max_len):
            n = len(alive)
            encn = self._select_enc(enc, torch.zeros(n, dtype=torch.long, device=device))
            y = torch.tensor(
                [h[0][-1] if h[0] else self.bos_idx for h in alive], dtype=torch.long, device=device
            )
            logits, new_state, w, _ = self.decode_step(y, state, encn)
            logp = self.log_probs(logits).double()
            total = (
                logp + torch.tensor([h[2] for h in alive], dtype=logp.dtype, device=device)[:, None]
            )
            flat = total.reshape(-1)
            top = torch.topk(flat, min(2 * k, flat.numel()))
            V = logp.shape[1]
            next_alive: list[tuple[list[int], list[Tensor], float]] = []
            keep: list[int] = []
            for rank, (value, index) in enumerate(
                zip(top.values.tolist(), top.indices.tolist(), strict=True)
            ):
                src_h, tok = divmod(index, V)
                toks, rows, _ = alive[src_h]
                if tok == self.eos_idx:
                    if rank < k:
                        finished.append((value / self._lp(len(toks) + 1, alpha), toks, rows, value))
                    continue
                if len(next_alive) < k:
                    next_alive.append(([*toks, tok], [*rows, w[src_h]], value))
                    keep.append(src_h)
            if len(finished) >= k or not next_alive:
                alive = []
                break
            alive = next_alive
            state = self._select(new_state, torch.tensor(keep, dtype=torch.long, device=device))
        for toks, rows, value in alive:
            finished.append((value / self._lp(len(toks), alpha), toks, rows, value))
        best = max(finished, key=lambda f: f[0])
        return best[1], best[2], best[3]


def sequence_log_prob(
    model: Seq2SeqTranslator, src: Tensor, tgt: list[int], eos: bool = True
) -> float:
    """``sum_t log p(y_t | y_<t, x)`` of the target ids ``tgt`` (EOS appended when ``eos``)
    for one source ``src`` ``[S]``: the score beam search ranks by."""
    ys = list(tgt) + ([model.eos_idx] if eos else [])
    tgt_in = torch.tensor([[model.bos_idx, *ys[:-1]]], device=src.device)
    with torch.no_grad():
        out = model(src[None], None, tgt_in)
    logp = model.log_probs(out.logits[0].double())
    return float(sum(logp[t, y] for t, y in enumerate(ys)))
