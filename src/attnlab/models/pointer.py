"""The pointer-network task model (Vinyals, Fortunato & Jaitly 2015), with the attention
swappable and the lab's two baselines.

The model is :class:`attnlab.query.pointer.PointerNetwork` (an LSTM encoder over the input
points, an LSTM decoder whose output at each step is its attention distribution over the
inputs) with the pointer's distribution chosen by a spec:

    e_j = Enc(W_e x_j)                              encoder states (the keys)
    d_i = Dec(W_e x_{C_(i-1)}, d_(i-1))             decoder states (the queries)
    p(C_i = j | C_<i, P) = softmax_j score(d_i, e_j)   over the allowed positions j

* a score name (``"additive"``, the paper's ``v^T tanh(W1 e_j + W2 d_i)``, by default;
  ``"general"``, ``"dot"``, ``"scaled-dot"``, ``"cosine"``, ``"multiplicative"``, ...) or a
  dict ``{"score": name, **options}`` (``d_w``, ``act``, ``bias``, ``temperature``, ...);
  ``"align"`` may only be ``"soft"``: the pointer distribution is the model's output and
  its log-likelihood is the training loss, so it must give every allowed position a
  positive probability (sparse or hard alignments give ``log 0``);
* ``"mean"``: no attention -- the decoder state and the unweighted average of the
  encoder states of the allowed (real, not yet chosen) inputs (with ``eos=True`` the
  learned end key too, while the end pointer is allowed) feed a linear classifier over
  the input *positions*, ``p(C_i = j) = softmax_j (W_o [d_i; mean_(allowed) e] + b_o)_j``
  (the sequence-to-sequence model with a fixed output dictionary that Vinyals et al.
  compare with); it needs ``max_inputs``, the largest input count;
* ``"uniform"``: the default attention with its weights replaced by ``1 / |allowed|``: every
  allowed position is equally likely, so greedy decoding points at the first allowed one.

Neither baseline can point well (the mean baseline must learn *where* things are from a
summary; the uniform one cannot learn at all): that is the expected result.

Greedy decoding and beam search (optionally masking the inputs already chosen,
``mask_chosen=True``) are inherited from :class:`~attnlab.query.pointer.PointerNetwork`.

Source: O. Vinyals, M. Fortunato, N. Jaitly, "Pointer Networks", NeurIPS 2015.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.query.pointer import PointerNetwork, masked_log_softmax
from attnlab.registry import register

__all__ = ["PointerNetworkModel"]

BASELINES = ("mean", "uniform")


def _parse_attention(attention: Any) -> tuple[str, Any, dict[str, Any]]:
    """``(mode, score, options)`` from a spec."""
    if isinstance(attention, str):
        if attention in BASELINES:
            return attention, "additive", {}
        return "attention", attention, {}
    if isinstance(attention, nn.Module):
        return "attention", attention, {}
    if isinstance(attention, Mapping):
        spec = dict(attention)
        name = spec.pop("name", None)
        if name in BASELINES:
            if spec:
                raise ConfigError(f"the {name!r} baseline takes no options, got {sorted(spec)}")
            return name, "additive", {}
        if name is not None:
            raise ConfigError(
                f"attention name must be 'mean' or 'uniform' (or give score=...), got {name!r}"
            )
        align = spec.pop("align", "soft")
        if align != "soft":
            raise ConfigError(
                f"a pointer network's output is its attention distribution and its loss the "
                f"log-likelihood of the target pointer, so align must be 'soft' (got "
                f"{align!r}: a sparse or hard alignment gives log 0 to most positions)"
            )
        uniform = spec.pop("uniform", False)
        score = spec.pop("score", "additive")
        return ("uniform" if uniform else "attention"), score, spec
    raise ConfigError(
        f"attention must be a score name, 'mean', 'uniform', a dict spec or a Score module, "
        f"got {type(attention).__name__}"
    )


@register("model", "pointer-network-model", aliases=("pointer-model", "ptr-net-model"))
class PointerNetworkModel(PointerNetwork):
    """Pointer network task model: :class:`~attnlab.query.pointer.PointerNetwork` with the
    pointer attention given by a spec (see the module docstring).

    Args:
        d_in: size of an input element (1 for numbers to sort, 2 for planar points).
        hidden_size: LSTM hidden size ``h`` (encoder and decoder; default 64).
        attention: a score name, a dict ``{"score": ..., **options}``, a Score module
            (``d_q = d_k = hidden_size``), ``"mean"`` or ``"uniform"``.
        max_inputs: the largest number of (padded) inputs ``n``; needed by ``"mean"``
            (its classifier has ``max_inputs`` outputs, + 1 with an end pointer).
        num_layers: LSTM layers. d_embed: size of the input embedding (default ``h``).
        mask_chosen: forbid pointing twice at the same input (a permutation / subset).
        eos: an end-of-sequence pointer at index ``n`` (variable-length outputs).

    Shapes: as :class:`~attnlab.query.pointer.PointerNetwork`: ``forward(x [B, n, d_in],
    targets [B, T], lengths=[B] | mask=[B, n])`` -> ``PointerOutput`` with ``log_probs``
    ``[B, T, N]`` (``N = n``, ``n + 1`` with an end pointer); its ``probs`` are the
    pointer attention weights (rows = output steps, columns = input positions);
    ``greedy(x, lengths=...)`` / ``beam_search(...)`` -> ``PointerDecoding``.

    Cost: the LSTMs O(B (n + T) h^2) and the additive pointer O(B T n d_w); the mean
    baseline's classifier O(B T h max_inputs).

    :formula: e = Enc(x); d_i = Dec(x_(C_(i-1))); p(C_i = j) = softmax_j score(d_i, e_j) over
        allowed j (mean baseline: softmax_j (W_o [d_i; mean e])_j; uniform: 1/|allowed|)
    :source: Vinyals, Fortunato & Jaitly 2015, Pointer Networks (NeurIPS)
    :cost: LSTMs O(B (n + T) h^2); pointer scores O(B T n d_w) time, O(B T n) memory
    """

    def __init__(
        self,
        d_in: int,
        hidden_size: int = 64,
        *,
        attention: str | dict[str, Any] | nn.Module = "additive",
        max_inputs: int | None = None,
        num_layers: int = 1,
        d_embed: int | None = None,
        mask_chosen: bool = True,
        eos: bool = False,
    ) -> None:
        mode, score, options = _parse_attention(attention)
        if mode == "mean":
            score, options = "dot", {}  # parameter-free and never called
        super().__init__(
            d_in,
            hidden_size,
            d_embed=d_embed,
            num_layers=num_layers,
            score=score,
            mask_chosen=mask_chosen,
            eos=eos,
            **options,
        )
        self.mode = mode
        self.max_inputs = max_inputs
        if mode == "mean":
            if isinstance(max_inputs, bool) or not isinstance(max_inputs, int) or max_inputs < 1:
                raise ConfigError(
                    f"the 'mean' baseline classifies input positions, so it needs max_inputs "
                    f"(the largest number of inputs) as a positive int, got {max_inputs!r}"
                )
            self.position_out = nn.Linear(2 * hidden_size, max_inputs + int(self.eos))
        else:
            self.register_module("position_out", None)

    def point(self, queries: Tensor, keys: Tensor, allowed: Tensor | None = None) -> Tensor:
        """The pointer's log-distribution ``[B, T, N]`` (``-inf`` where not allowed): the
        attention's for a score spec, ``1/|allowed|`` for ``"uniform"``, the position
        classifier's for ``"mean"``."""
        if self.mode == "attention":
            return super().point(queries, keys, allowed)
        if allowed is not None and allowed.dtype != torch.bool:
            raise TypeError(f"allowed has dtype {allowed.dtype}, expected torch.bool")
        B, T = queries.shape[:2]
        N = keys.shape[1]
        if allowed is not None:
            allowed = allowed.expand(B, T, N)
        if self.mode == "uniform":
            # the weights replaced by 1/|allowed| (kept in the graph: zero gradients)
            e = self.score(queries, keys) * 0.0
            return masked_log_softmax(e, allowed)
        assert self.position_out is not None
        if N > self.position_out.out_features:
            raise ValueError(
                f"the 'mean' baseline was built for at most {self.max_inputs} inputs "
                f"(max_inputs), got {N - int(self.eos)}"
            )
        if allowed is None:
            ctx = keys.mean(1, keepdim=True).expand(B, T, keys.shape[2])
        else:
            w = allowed.to(keys.dtype)
            ctx = (w @ keys) / w.sum(-1, keepdim=True).clamp(min=1.0)  # [B, T, h]
        logits = self.position_out(torch.cat([queries, ctx], -1))
        if self.eos:  # the end pointer is the classifier's last output, at index n
            n = N - 1
            logits = torch.cat([logits[..., :n], logits[..., -1:]], -1)
        else:
            logits = logits[..., :N]
        return masked_log_softmax(logits, allowed)
