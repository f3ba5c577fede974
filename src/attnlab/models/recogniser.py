"""Speech recognition with attention: "Listen, Attend and Spell" (Chan et al. 2016), with
the attention swappable.

The *listener* reads log-mel frames ``x_1..x_T`` (``[B, T, n_mels]``, with their lengths):
a bidirectional LSTM over the frames (``stack`` consecutive frames concatenated into
one step, 1 by default), then ``pyramid`` pyramidal BiLSTM layers, each over
pairs of consecutive outputs of the layer below (``[h_{2i}; h_{2i+1}]``), so each halves
the time axis; a linear map gives the annotation vectors ``a_1..a_S`` (``S = ceil(T /
(stack 2^pyramid))``, padding frames zeroed and masked). The *speller* emits one character or
phoneme per step (Chan et al.'s order: state first, then the attention)::

    s_0 = tanh(W_s mean_l a_l),  c_0 = 0
    s_t = LSTM([E y_{t-1}; c_{t-1}], s_{t-1})
    e_{t,l} = score(s_t, a_l);  alpha_t = align(e_t) over the real l;  c_t = sum_l alpha_{t,l} a_l
    p(y_t) = softmax(W_o tanh(W_p [s_t; c_t]))

Any registered score / alignment works (default additive, soft), except local-m, whose
window centre ``p_t = t`` assumes as many frames as output units (a ``ConfigError``; use
local-p). With
``score="location-aware"`` (Chorowski et al. 2015) the previous step's weights
``alpha_{t-1}`` are passed along (zeros at ``t = 1``). Baselines: ``"mean"`` (``c_t`` = the
mean of the real annotation vectors, no attention parameters) and ``"uniform"`` (the
attention module kept, its weights replaced by ``1/S`` over the real vectors). A hard
alignment returns the ``log_prob`` of its samples for a REINFORCE term.

Cost: the listener O(B T h (n_mels + h)) for the bottom layer and O(B T h^2) for the
pyramid (each layer half the previous length); per output step O(B d (d_e + 2d)) for the
LSTM plus O(B S d d_w) for an additive score.

Sources: W. Chan, N. Jaitly, Q. Le and O. Vinyals, "Listen, Attend and Spell: A Neural
Network for Large Vocabulary Conversational Speech Recognition", ICASSP 2016;
J. Chorowski, D. Bahdanau, D. Serdyuk, K. Cho and Y. Bengio, "Attention-Based Models for
Speech Recognition", NeurIPS 2015; frame stacking as in H. Sak, A. Senior, K. Rao and
F. Beaufays, "Fast and Accurate Recurrent Neural Network Acoustic Models for Speech
Recognition", Interspeech 2015.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import check_int, is_traced
from attnlab._recurrent import bound_rnn_weights
from attnlab.general.attention import Attention
from attnlab.models._decoder import decoder_attention, greedy_decode, teacher_forcing
from attnlab.models._inputs import check_dropout, check_ids, check_index, check_sizes
from attnlab.models._pooling import uniform_context, uniform_weights
from attnlab.models._rnn import run_packed
from attnlab.output import output_pytree
from attnlab.registry import Configurable, register

__all__ = ["ListenAttendSpell", "Listened", "Listener", "RecogniserOutput", "Transcript"]


@dataclass
class Listened:
    """The listener's result: annotation vectors ``keys`` ``[B, S, d]`` (zero on padding)
    and their ``mask`` ``[B, S]`` (True = real)."""

    keys: Tensor
    mask: Tensor


@output_pytree()
@dataclass
class RecogniserOutput:
    """Teacher-forced result: ``logits`` ``[B, L, V]``, attention ``weights`` ``[B, L, S]``
    (one row per output unit), ``mask`` ``[B, S]`` of the real annotation vectors, and for
    a stochastic alignment the ``log_prob`` ``[B, L]`` of each step's sample (else None)."""

    logits: Tensor
    weights: Tensor
    mask: Tensor
    log_prob: Tensor | None = None


@dataclass
class Transcript:
    """Greedy transcripts: ``tokens`` per utterance (ids, without BOS/EOS) and
    ``attention`` per utterance (``[len(tokens), S_b]`` over its real annotation vectors)."""

    tokens: list[list[int]]
    attention: list[Tensor]


def _stack(x: Tensor, lengths: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Groups of ``k`` consecutive steps concatenated, ``[B, T, h] -> [B, ceil(T/k), k h]``
    (the last group completed with zeros; ``x`` must be zero on padding), and the new
    lengths ``ceil(lengths / k)``."""
    B, T, h = x.shape
    n = -(-T // k)
    if n * k > T:
        x = torch.cat([x, x.new_zeros(B, n * k - T, h)], 1)
    return x.reshape(B, n, k * h), -(-lengths // k)


class Listener(nn.Module):
    """The pyramidal BiLSTM listener (see the module docstring): ``forward(features [B, T,
    n_mels], lengths [B])`` -> :class:`Listened` with ``S = ceil(ceil(T / stack) /
    2^pyramid)`` (``stack`` frames concatenated before the bottom layer)."""

    def __init__(
        self, n_mels: int, hidden_size: int, pyramid: int, out_dim: int, stack: int = 1
    ) -> None:
        super().__init__()
        h = hidden_size
        self.stack = stack
        self.bottom = nn.LSTM(stack * n_mels, h, batch_first=True, bidirectional=True)
        self.pyramid = nn.ModuleList(
            nn.LSTM(4 * h, h, batch_first=True, bidirectional=True) for _ in range(pyramid)
        )
        self.proj = nn.Linear(2 * h, out_dim)
        # each BiLSTM's weights, for the packed run and its traced form (models._rnn)
        pyramid = (bound_rnn_weights(self.pyramid, str(i)) for i in range(len(self.pyramid)))
        self._weights = [bound_rnn_weights(self, "bottom"), *pyramid]

    def forward(self, features: Tensor, lengths: Tensor) -> Listened:
        T = features.shape[1]
        mask = torch.arange(T, device=features.device)[None, :] < lengths[:, None]
        x, lengths = _stack(features * mask[..., None], lengths, self.stack)
        x = run_packed(self._weights[0], x, lengths, training=self.training)
        for weights in self._weights[1:]:
            x, lengths = _stack(x, lengths, 2)
            x = run_packed(weights, x, lengths, training=self.training)
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        return Listened(self.proj(x) * mask[..., None], mask)


@register("model", "recogniser", aliases=("las", "listen-attend-spell", "speech-recogniser"))
class ListenAttendSpell(Configurable):
    """Listen, Attend and Spell recogniser (see the module docstring).

    Args:
        vocab_size: the number of output ids (characters or phonemes; ``pad_idx``,
            ``bos_idx``, ``eos_idx`` among them).
        n_mels: the features per frame.
        listener_size: ``h``, each direction's LSTM size in the listener.
        pyramid: the pyramidal layers (each halves the time axis; 0 = none).
        stack: frames concatenated before the bottom layer (1 = none; 3 divides the
            listener's cost by about 3, as frame stacking does in Sak et al. 2015).
        embed_dim: ``d_e``, the output-unit embedding. hidden_size: ``d``, the speller's
            state and the annotation vectors' size.
        attention: ``None`` (additive score, soft alignment), a score name, a dict
            ``{"score": ..., "align": ..., **options}`` for :class:`attnlab.Attention`
            (``"uniform": True`` gives its uniform baseline), ``"mean"`` or ``"uniform"``.
        dropout: on the inputs of both output layers, W_p and W_o (training only).
        pad_idx, bos_idx, eos_idx: the special ids.

    Shapes: ``forward(features [B, T, n_mels], lengths [B], tokens_in [B, L])`` ->
    :class:`RecogniserOutput` (``tokens_in`` starts with BOS: the gold units shifted
    right); ``greedy(features, lengths, max_len)`` -> :class:`Transcript`.

    :formula: a = pBLSTM(log-mel frames); s_t = LSTM([E y_{t-1}; c_{t-1}], s_{t-1}); c_t = sum_l
        align(score(s_t, a_l)) a_l; p(y_t) = softmax(W_o tanh(W_p [s_t; c_t]))
    :source: Chan et al. 2016, Listen, Attend and Spell; Chorowski et al. 2015, Attention-Based
        Models for Speech Recognition
    :cost: listener O(B T h (n_mels + h)) + per unit LSTM O(B d (d_e + 2d)) + attention O(B S d
        d_w)
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        n_mels: int = 40,
        listener_size: int = 64,
        pyramid: int = 2,
        stack: int = 1,
        embed_dim: int = 32,
        hidden_size: int = 64,
        dropout: float = 0.0,
        attention: str | dict[str, Any] | None = None,
        pad_idx: int = 0,
        bos_idx: int = 1,
        eos_idx: int = 2,
    ) -> None:
        super().__init__()
        check_sizes(
            vocab_size=vocab_size,
            n_mels=n_mels,
            listener_size=listener_size,
            embed_dim=embed_dim,
            hidden_size=hidden_size,
            stack=stack,
        )
        check_int(pyramid, "pyramid", 0)
        check_dropout(dropout)
        check_index(vocab_size, pad_idx=pad_idx, bos_idx=bos_idx, eos_idx=eos_idx)
        self.vocab_size, self.n_mels = vocab_size, n_mels
        self.pyramid, self.stack = pyramid, stack
        self.pad_idx, self.bos_idx, self.eos_idx = pad_idx, bos_idx, eos_idx
        d = self.d = hidden_size
        self.listener = Listener(n_mels, listener_size, pyramid, d, stack)
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_idx)
        self.init_h = nn.Linear(d, d)
        self.cell = nn.LSTMCell(embed_dim + d, d)
        self.pre_output = nn.Linear(2 * d, d)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(d, vocab_size)
        self.attention: Attention | None
        self.attention, self.uniform = decoder_attention(
            attention,
            d,
            "additive",
            no_local_m="the listener's frames far outnumber the output units",
        )

    @property
    def location(self) -> bool:
        """Whether the score reads the previous step's weights (location-aware)."""
        score = getattr(self.attention, "score", None)
        return bool(getattr(score, "uses_prev_weights", False))

    # ------------------------------------------------------------------ parts

    def _check_features(self, features: Any, lengths: Any) -> Tensor:
        if not isinstance(features, Tensor) or not features.dtype.is_floating_point:
            raise TypeError(
                f"features must be a float torch.Tensor [B, T, n_mels], got "
                f"{getattr(features, 'dtype', type(features).__name__)}"
            )
        if features.dim() != 3 or features.shape[2] != self.n_mels or features.shape[1] < 1:
            raise ValueError(
                f"features has shape {tuple(features.shape)}, expected [B, T, n_mels] = "
                f"[B, T >= 1, {self.n_mels}]"
            )
        B, T = features.shape[:2]
        t = lengths if isinstance(lengths, Tensor) else torch.as_tensor(lengths)
        if t.dtype.is_floating_point or t.dtype == torch.bool or tuple(t.shape) != (B,):
            raise ValueError(
                f"lengths must be an integer tensor [B] = [{B}], got {t.dtype} of shape "
                f"{tuple(t.shape)}"
            )
        # a check of values reads them on the host: eager only (one graph under compile)
        if B and not is_traced() and (int(t.min()) < 1 or int(t.max()) > T):
            raise ValueError(
                f"lengths hold values in [{int(t.min())}, {int(t.max())}], outside [1, T] = "
                f"[1, {T}] for features of shape {tuple(features.shape)}"
            )
        return t.to(device=features.device, dtype=torch.long)

    def listen(self, features: Tensor, lengths: Tensor) -> Listened:
        """Annotation vectors ``[B, S, d]`` and their mask of ``[B, T, n_mels]`` frames."""
        lengths = self._check_features(features, lengths)
        return self.listener(features.to(self.output.weight.dtype), lengths)

    def init_state(self, enc: Listened) -> dict[str, Tensor]:
        B, S = enc.mask.shape
        mean = uniform_context(None, uniform_weights(enc.mask, enc.keys.dtype), enc.keys)
        return {
            "h": torch.tanh(self.init_h(mean)),
            "c": torch.zeros_like(mean),
            "ctx": torch.zeros_like(mean),
            "prev": enc.keys.new_zeros(B, S),
        }

    def attend(self, h: Tensor, prev: Tensor, enc: Listened) -> tuple[Tensor, Tensor, Any]:
        """Context ``[B, d]``, weights ``[B, S]`` and log_prob (``[B]`` or None) of a step."""
        if self.attention is None or self.uniform:
            w = uniform_weights(enc.mask, enc.keys.dtype)
            return uniform_context(self.attention, w, enc.keys), w, None
        extra = {"prev_weights": prev} if self.location else {}
        out = self.attention(h, enc.keys, mask=enc.mask, need_weights=True, **extra)
        return out.context, out.weights, out.log_prob

    def step(
        self, y_prev: Tensor, state: dict[str, Tensor], enc: Listened
    ) -> tuple[Tensor, dict[str, Tensor], Tensor, Any]:
        """One output unit: ``y_prev`` ``[B]`` -> logits ``[B, V]``, the new state, the
        weights ``[B, S]`` and the log_prob of a sampled alignment (or None)."""
        emb = self.embedding(y_prev)
        h, c = self.cell(torch.cat([emb, state["ctx"]], -1), (state["h"], state["c"]))
        ctx, weights, log_prob = self.attend(h, state["prev"], enc)
        hidden = torch.tanh(self.pre_output(self.dropout(torch.cat([h, ctx], -1))))
        logits = self.output(self.dropout(hidden))
        return logits, {"h": h, "c": c, "ctx": ctx, "prev": weights}, weights, log_prob

    # ------------------------------------------------------------------ training

    def forward(self, features: Tensor, lengths: Tensor, tokens_in: Tensor) -> RecogniserOutput:
        """Teacher forcing over ``tokens_in`` ``[B, L]`` (BOS first)."""
        enc = self.listen(features, lengths)
        B, S = enc.mask.shape
        check_ids(
            tokens_in, self.vocab_size, name="tokens_in", layout="[B, L]", batch=B,
            batch_of="the utterances in features",
        )  # fmt: skip

        def step(y: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, Any, Tensor, Any]:
            return self.step(y, state, enc)

        start = self.init_state(enc)
        logits, weights, log_prob = teacher_forcing(
            step, start, tokens_in, enc.keys, self.vocab_size, S
        )
        return RecogniserOutput(logits, weights, enc.mask, log_prob)

    @torch.no_grad()
    def greedy(self, features: Tensor, lengths: Tensor, max_len: int = 50) -> Transcript:
        """The most probable unit at every step until EOS or ``max_len`` units (PAD and BOS
        are never emitted)."""
        check_int(max_len, "max_len", 1, error=ValueError)
        enc = self.listen(features, lengths)
        tokens, rows, _ = greedy_decode(self, enc, enc.mask.shape[0], enc.keys.device, max_len)
        real = enc.mask.sum(1).tolist()
        attention = [r[:, : real[b]] for b, r in enumerate(rows)]
        return Transcript(tokens, attention)
