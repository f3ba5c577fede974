"""What the attentive decoders of the lab share: the translator (Bahdanau et al. 2015,
Luong et al. 2015) and the captioner (Xu et al. 2015) both attend once per output word.

* :func:`decoder_attention` -- the attention of a decoder from its spec: ``None`` (the
  model's default score, soft alignment), a score name, a dict ``{"score": ...,
  "align": ..., **options}`` for :class:`attnlab.Attention`, or the baselines ``"mean"``
  (no attention) and ``"uniform"`` (``1/n`` weights; also ``"uniform": True`` in a dict);
* :func:`teacher_forcing` -- the decoder run over the gold words ``[B, T]`` (BOS first),
  one step per word: O(T) steps of the model's cost;
* :func:`greedy_search` -- the decoder fed its own most probable word until EOS: at most
  ``max_len`` steps of the model's cost;
* :func:`greedy_decode` -- :func:`greedy_search` of a :class:`Decoder` model from BOS,
  never generating PAD or BOS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

from attnlab._checks import ConfigError, check_int, pad_to_compiled_steps
from attnlab.general.alignment import refuse_local_m
from attnlab.general.attention import Attention

__all__ = ["Decoder", "decoder_attention", "greedy_decode", "greedy_search", "teacher_forcing"]

#: scores with an inner size ``d_w``, which a decoder may set to its state size
_SCORES_WITH_D_W = ("additive", "concat", "bahdanau", "mlp")

Step = Callable[[Tensor, Any], tuple[Tensor, Any, Tensor, Tensor | None]]


def _spec(attention: Any) -> dict[str, Any]:
    if attention is None:
        return {}
    if isinstance(attention, str):
        named = {"mean": {"mean": True}, "uniform": {"uniform": True}}
        return dict(named.get(attention, {"score": attention}))
    if isinstance(attention, dict):
        return dict(attention)
    raise ConfigError(
        f"attention must be None, a score name, a dict spec, 'mean' or 'uniform', got "
        f"{type(attention).__name__}"
    )


def decoder_attention(
    attention: Any,
    d: int,
    default_score: str,
    *,
    d_w: int | None = None,
    no_local_m: str | None = None,
) -> tuple[Attention | None, bool]:
    """(the :class:`attnlab.Attention` of a decoder with state and keys of size ``d``, or
    None for ``"mean"``; whether its weights are replaced by uniform ones). ``d_w`` is the
    default inner size of the scores that take one (additive, concat). ``no_local_m``: why
    a decoder that does not centre local-m's window on its step (``p_t = t``) refuses it
    (completes "but ..." in :func:`attnlab.general.alignment.refuse_local_m`'s
    ``ConfigError``; ``None``: the decoder passes the step)."""
    spec = _spec(attention)
    if spec.pop("name", None) is not None:
        raise ConfigError(
            "the model's attention dict takes score=/align=, not name= (presets are the "
            "task's business)"
        )
    if spec.pop("mean", False):
        return None, False
    uniform = bool(spec.pop("uniform", False))
    score = spec.pop("score", default_score)
    align = spec.pop("align", "soft")
    if d_w is not None and score in _SCORES_WITH_D_W:
        spec.setdefault("d_w", d_w)
    module = Attention(score, align, d_q=d, d_k=d, **spec)
    if no_local_m is not None:
        refuse_local_m(module.align, no_local_m, "the state")
    return module, uniform


def teacher_forcing(
    step: Step, state: Any, tokens_in: Tensor, ref: Tensor, vocab_size: int, n_keys: int
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Run ``step(y_prev [B], state) -> (logits [B, V], state, weights [B, n_keys],
    log_prob [B] | None)`` over the columns of ``tokens_in`` ``[B, T]``: (logits ``[B, T,
    V]``, weights ``[B, T, n_keys]``, log_prob ``[B, T]`` or None). ``ref`` gives the dtype
    and device of the empty result when ``T = 0``.

    Under ``torch.compile`` the loop runs :func:`attnlab._checks.compiled_steps` ``(T)``
    steps (``T`` rounded up to a power of two, on word 0 past the gold words) and keeps the
    first ``T``: a later step never reaches an earlier one's results, and a graph then
    serves a range of target lengths instead of one."""
    B, T = tokens_in.shape
    tokens_in = pad_to_compiled_steps(tokens_in, 1)  # word 0: a valid id of any vocabulary
    logits, weights, log_probs = [], [], []
    for t in range(tokens_in.shape[1]):
        lg, state, w, lp = step(tokens_in[:, t], state)
        logits.append(lg)
        weights.append(w)
        if lp is not None:
            log_probs.append(lp)
    if not logits:
        return ref.new_zeros(B, 0, vocab_size), ref.new_zeros(B, 0, n_keys), None
    log_prob = torch.stack(log_probs, 1)[:, :T] if log_probs else None
    return torch.stack(logits, 1)[:, :T], torch.stack(weights, 1)[:, :T], log_prob


def greedy_search(
    step: Step,
    state: Any,
    y: Tensor,
    eos_idx: int,
    max_len: int,
    score: Callable[[Tensor], Tensor],
) -> tuple[list[list[int]], list[Tensor], list[float]]:
    """Greedy decoding from the first inputs ``y`` ``[B]`` (BOS): at every step
    ``step(y, state)`` gives the logits ``[B, V]``, ``score(logits)`` ``[B, V]`` (e.g. the
    log-probabilities with the words never generated at ``-inf``) picks ``y = argmax``; a
    row stops at EOS (not kept) or after ``max_len`` words. Returns per row its words, the
    attention weights of the steps that made them (``[n_words, n_k]``) and the sum of
    their scores (EOS's included). The batch stays on the device while it decodes: one
    host sync per step (has every row ended?), the rows are cut at their EOS after."""
    check_int(max_len, "max_len", 1, error=ValueError)  # -1 gave empty outputs, 2.5 a loop error
    B = y.shape[0]
    ended = torch.zeros(B, dtype=torch.bool, device=y.device)
    words, weights, picked = [], [], []
    for _ in range(max_len):
        logits, state, w, _ = step(y, state)
        scores = score(logits)
        y = scores.argmax(-1)
        words.append(y)
        weights.append(w)
        picked.append(scores.gather(-1, y[:, None])[:, 0])
        ended |= y == eos_idx
        if bool(ended.all()):
            break
    if not words:
        return [[] for _ in range(B)], [y.new_zeros(0, 0, dtype=torch.float)] * B, [0.0] * B
    emitted = torch.stack(words, 1).tolist()  # [B, steps]
    attention = torch.stack(weights, 1)  # [B, steps, n_k]
    gains = torch.stack(picked, 1)  # [B, steps]
    tokens, rows, totals = [], [], []
    for b, seq in enumerate(emitted):
        n = seq.index(eos_idx) if eos_idx in seq else len(seq)
        tokens.append(seq[:n])
        rows.append(attention[b, :n])
        totals.append(float(gains[b, : min(n + 1, len(seq))].sum()))
    return tokens, rows, totals


class Decoder(Protocol):
    """What :func:`greedy_decode` needs of a model: its special ids, its first state from
    the encoded input (``memory``) and one step of its decoder."""

    pad_idx: int
    bos_idx: int
    eos_idx: int

    def init_state(self, memory: Any) -> Any: ...

    def step(
        self, y_prev: Tensor, state: Any, memory: Any
    ) -> tuple[Tensor, Any, Tensor, Tensor | None]: ...


def greedy_decode(
    model: Decoder, memory: Any, batch: int, device: torch.device, max_len: int
) -> tuple[list[list[int]], list[Tensor], list[float]]:
    """:func:`greedy_search` of ``model.step`` over ``memory`` for ``batch`` rows on
    ``device``, from BOS, for at most ``max_len`` words; PAD and BOS are never generated
    (their logits are set to ``-inf``), so a row ends at EOS or ``max_len``. Returns per
    row its words, its attention weights ``[n_words, n_k]`` and the sum of the picked
    logits."""
    never = [model.pad_idx, model.bos_idx]

    def never_pad_or_bos(logits: Tensor) -> Tensor:
        logits[:, never] = float("-inf")
        return logits

    return greedy_search(
        lambda y, state: model.step(y, state, memory),
        model.init_state(memory),
        torch.full((batch,), model.bos_idx, dtype=torch.long, device=device),
        model.eos_idx,
        max_len,
        never_pad_or_bos,
    )
