"""The benchmark cases: each pairs an ``attnlab.Attention`` call with a reference written
directly in PyTorch, both with the same weights and inputs, forward + backward, float32.

A case's ``attn`` and ``ref`` callables run the forward pass and return the output; a
:class:`Pair` adds the backward pass (with a fixed random output gradient), resets the
gradients between calls and checks once that both sides give the same output and the same
gradients for every input and parameter (:meth:`Pair.check`).

Sizes come in three modes: ``full`` (the issue's sizes), ``quick`` (the same sizes, fewer
repeats) and ``tiny`` (toy sizes for the smoke test: checks the code, not the speed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from _harness import check_close
from torch import Tensor

import attnlab
from attnlab.functional import local_align

MODES = ("full", "quick", "tiny")

# repeats (timed calls per side) and warm-up calls per side, by mode
REPEATS = {
    "full": {"sdpa-512": (9, 2), "sdpa-2048": (7, 1), "additive": (5, 1), "multidim": (5, 1),
             "local": (5, 1), "local-scaling": (15, 3)},
    "quick": {"sdpa-512": (2, 1), "sdpa-2048": (2, 1), "additive": (2, 1), "multidim": (2, 1),
              "local": (2, 1), "local-scaling": (3, 1)},
    "tiny": {"sdpa-512": (1, 0), "sdpa-2048": (1, 0), "additive": (1, 0), "multidim": (1, 0),
             "local": (1, 0), "local-scaling": (1, 0)},
}  # fmt: skip

SIZES = {
    "full": {
        "sdpa": {"B": 32, "ns": (512, 2048), "d": 64},
        "additive": {"B": 8, "n": 1024, "d": 64, "d_w": 64},
        "multidim": {"B": 8, "n": 512, "d": 64, "d_w": 64},
        "local": {"B": 1, "n": 16384, "d": 64, "D": 8, "scaling": (2048, 4096, 8192, 16384)},
    },
    "tiny": {
        "sdpa": {"B": 2, "ns": (16, 40), "d": 8},
        "additive": {"B": 2, "n": 24, "d": 8, "d_w": 6},
        "multidim": {"B": 2, "n": 12, "d": 8, "d_w": 6},
        "local": {"B": 2, "n": 96, "d": 8, "D": 3, "scaling": (24, 48, 96)},
    },
}
SIZES["quick"] = SIZES["full"]


def sizes(case: str, mode: str) -> dict:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return SIZES[mode][case]


@dataclass
class Pair:
    """attnlab vs reference on the same inputs and weights.

    ``leaves`` are the tensors whose gradients both sides produce (inputs and
    parameters); ``grad_out`` is the gradient fed into the output."""

    name: str
    attn: Callable[[], Tensor]
    ref: Callable[[], Tensor]
    leaves: list[Tensor]
    leaf_names: list[str]
    grad_out: Tensor
    rtol: float = 1e-4
    atol: float = 1e-5
    overrides: dict[str, dict[str, float]] = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def _step(self, forward: Callable[[], Tensor]) -> Tensor:
        for t in self.leaves:
            t.grad = None
        out = forward()
        out.backward(self.grad_out)
        return out

    def step_attn(self) -> Tensor:
        return self._step(self.attn)

    def step_ref(self) -> Tensor:
        return self._step(self.ref)

    def side(self, which: str) -> Callable[[], Tensor]:
        if which == "attnlab":
            return self.step_attn
        if which == "reference":
            return self.step_ref
        raise ValueError(f"side must be 'attnlab' or 'reference', got {which!r}")

    def check(self) -> float:
        """Run each side once and assert equal outputs and gradients; returns the largest
        difference relative to the reference tensor's scale (see ``check_close``)."""
        out_a = self.step_attn().detach().clone()
        grads_a = [None if t.grad is None else t.grad.clone() for t in self.leaves]
        out_r = self.step_ref().detach().clone()
        grads_r = [None if t.grad is None else t.grad.clone() for t in self.leaves]
        for t in self.leaves:
            t.grad = None
        return check_close(
            self.name,
            [out_a, *grads_a],
            [out_r, *grads_r],
            ["output", *(f"grad {n}" for n in self.leaf_names)],
            rtol=self.rtol,
            atol=self.atol,
            overrides={f"grad {k}": o for k, o in self.overrides.items()},
        )


def _param_sums(*names: str) -> dict[str, dict[str, float]]:
    """Tolerance overrides for parameter gradients, which sum ``B n_q n_k`` products: in
    float32 attnlab and the reference are each about ``1e-4 * max|grad|`` off the float64
    value (measured at the full sizes), so they are compared relative to the gradient's
    scale."""
    return {n: {"srtol": 5e-4} for n in names}


def _inputs(seed: int, *shapes: tuple[int, ...]) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def _randomise(params: list[Tensor], seed: int, scale: float = 0.1) -> None:
    """Give zero-initialised parameters (biases) random values, so that the agreement
    check also covers them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(scale * torch.randn(p.shape, generator=g))


def _expect_path(attn: attnlab.Attention, want: str, **kw: object) -> str:
    path, why = attn.explain(**kw)
    if path != want:
        raise AssertionError(
            f"expected attnlab to take the {want!r} path, it takes {path!r}: {why}"
        )
    return path


# --------------------------------------------------------------------------- sdpa


def sdpa_pairs(mode: str, seed: int = 0) -> list[tuple[Pair, Callable[[], Tensor]]]:
    """Scaled-dot soft attention through ``attnlab.Attention`` on ``[B, n, d]`` vs
    ``F.scaled_dot_product_attention`` called directly on ``[B, 1, n, d]``, the layout that
    reaches PyTorch's fused CPU kernel (a 3-D call runs on the slower math kernel),
    self-attention shapes. Each entry also carries the attnlab call with ``need_weights=True``
    (its forward + backward step, backward through the context only)."""
    sz = sizes("sdpa", mode)
    B, d = sz["B"], sz["d"]
    out = []
    for n in sz["ns"]:
        q, k, v = _inputs(seed + n, (B, n, d), (B, n, d), (B, n, d))
        torch.manual_seed(seed)  # the module's parameter init
        attn = attnlab.Attention(score="scaled-dot", align="soft", d_q=d, d_k=d)
        path = _expect_path(attn, "sdpa")
        grad_out = torch.randn(B, n, d, generator=torch.Generator().manual_seed(seed + 1))

        pair = Pair(
            name=f"sdpa n={n}",
            attn=lambda attn=attn, q=q, k=k, v=v: attn(q, k, v).context,
            ref=lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                q[:, None], k[:, None], v[:, None]
            )[:, 0],
            leaves=[q, k, v],
            leaf_names=["q", "k", "v"],
            grad_out=grad_out,
            info={"config": f"B={B} n_q=n_k={n} d={d}", "path": path, "n": n},
        )

        def step_weights(pair: Pair = pair, attn=attn, q=q, k=k, v=v) -> Tensor:
            return pair._step(lambda: attn(q, k, v, need_weights=True).context)

        out.append((pair, step_weights))
    return out


def check_sdpa_weights(mode: str, seed: int = 0) -> float:
    """``need_weights=True``: the context is unchanged and the weights equal
    ``softmax(q k^T / sqrt(d))`` computed here directly (smallest configured n)."""
    sz = sizes("sdpa", mode)
    B, d, n = sz["B"], sz["d"], sz["ns"][0]
    q, k, v = (t.detach() for t in _inputs(seed + n, (B, n, d), (B, n, d), (B, n, d)))
    attn = attnlab.Attention(score="scaled-dot", align="soft", d_q=d, d_k=d)
    with torch.no_grad():
        res = attn(q, k, v, need_weights=True)
        plain = attn(q, k, v).context
        want_w = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1)
    return check_close(
        "sdpa need_weights",
        [res.context, res.weights],
        [plain, want_w],
        ["context with weights", "weights"],
    )


# --------------------------------------------------------------------------- additive


def additive_pair(mode: str, seed: int = 0) -> Pair:
    """Additive (Bahdanau) soft attention through ``attnlab.Attention`` (lean chunked
    kernel) vs the textbook broadcast form
    ``softmax(tanh(W1 q[:, :, None] + W2 k[:, None] + b) @ w) @ v`` with the same weights.
    The bias is folded into ``W1 q`` on both sides, so it costs the reference nothing."""
    sz = sizes("additive", mode)
    B, n, d, d_w = sz["B"], sz["n"], sz["d"], sz["d_w"]
    q, k, v = _inputs(seed, (B, n, d), (B, n, d), (B, n, d))
    torch.manual_seed(seed)  # the module's parameter init
    attn = attnlab.Attention(score="additive", align="soft", d_q=d, d_k=d, d_w=d_w)
    path = _expect_path(attn, "lean-additive")
    s = attn.score
    _randomise([s.b], seed + 7)
    W1, W2, b, w = s.W1.weight, s.W2.weight, s.b, s.w

    def ref() -> Tensor:
        q1 = F.linear(q, W1, b)  # [B, n_q, d_w]
        k2 = F.linear(k, W2)  # [B, n_k, d_w]
        e = torch.tanh(q1[:, :, None, :] + k2[:, None, :, :]) @ w  # [B, n_q, n_k]
        return torch.bmm(torch.softmax(e, dim=-1), v)

    g = torch.Generator().manual_seed(seed + 1)
    return Pair(
        name="additive",
        attn=lambda: attn(q, k, v).context,
        ref=ref,
        leaves=[q, k, v, W1, W2, b, w],
        leaf_names=["q", "k", "v", "W1", "W2", "b", "w"],
        grad_out=torch.randn(B, n, d, generator=g),
        overrides=_param_sums("W1", "W2", "b", "w"),
        info={"config": f"B={B} n_q=n_k={n} d={d} d_w={d_w}", "path": path},
    )


# --------------------------------------------------------------------- multi-dimensional


def multidim_pair(mode: str, seed: int = 0) -> Pair:
    """Multi-dimensional (DiSAN) additive attention through ``attnlab.Attention``
    (fused lean kernel) vs its naive broadcast form:
    ``e = tanh(W1 q[:, :, None] + W2 k[:, None] + b) @ W_d + b_d``, softmax over the keys
    per feature, ``c = (a * v[:, None]).sum(2)``."""
    sz = sizes("multidim", mode)
    B, n, d, d_w = sz["B"], sz["n"], sz["d"], sz["d_w"]
    q, k, v = _inputs(seed, (B, n, d), (B, n, d), (B, n, d))
    torch.manual_seed(seed)  # the module's parameter init
    attn = attnlab.Attention(score="additive", align="soft", dim="multi", d_q=d, d_k=d, d_w=d_w)
    path = _expect_path(attn, "lean-multi")
    s = attn.score
    _randomise([s.b, s.b_d], seed + 7)
    W1, W2, b, W_d, b_d = s.W1.weight, s.W2.weight, s.b, s.w, s.b_d

    def ref() -> Tensor:
        q1 = F.linear(q, W1, b)
        k2 = F.linear(k, W2)
        e = torch.tanh(q1[:, :, None, :] + k2[:, None, :, :]) @ W_d + b_d  # [B, n_q, n_k, d_v]
        a = torch.softmax(e, dim=2)
        return (a * v[:, None, :, :]).sum(2)

    g = torch.Generator().manual_seed(seed + 1)
    return Pair(
        name="multidim",
        attn=lambda: attn(q, k, v).context,
        ref=ref,
        # b_d's gradient is zero in exact arithmetic (it cancels in the softmax); the
        # reference's is a sum of B n_q n_k rounding errors, hence the absolute tolerance
        leaves=[q, k, v, W1, W2, b, W_d, b_d],
        leaf_names=["q", "k", "v", "W1", "W2", "b", "W_d", "b_d"],
        grad_out=torch.randn(B, n, d, generator=g),
        overrides={**_param_sums("W1", "W2", "b", "W_d"), "b_d": {"atol": 5e-5}},
        info={"config": f"B={B} n_q=n_k={n} d={d} d_w={d_w}", "path": path},
    )


# --------------------------------------------------------------------------- local-p


def local_pair(mode: str, n: int | None = None, seed: int = 0) -> Pair:
    """Local-p attention (Luong et al. 2015) through ``attnlab.Attention`` (only the
    ``2D + 1`` keys of each window are scored) vs the same weights computed over the full
    score matrix: ``e = q k^T / sqrt(d)``, ``attnlab.functional.local_align(e, p, D)``
    with the same predicted centres ``p = (n_k - 1) sigmoid(w_p^T tanh(W_p q))``, then
    ``bmm``. Self-attention shapes, ``n_q = n_k = n``."""
    sz = sizes("local", mode)
    B, d, D = sz["B"], sz["d"], sz["D"]
    n = sz["n"] if n is None else n
    q, k, v = _inputs(seed + n, (B, n, d), (B, n, d), (B, n, d))
    torch.manual_seed(seed)  # the module's parameter init
    attn = attnlab.Attention(score="scaled-dot", align="local-p", d_q=d, d_k=d, D=D)
    path = _expect_path(attn, "local-window")
    al = attn.align
    W_p, w_p = al.W_p.weight, al.w_p

    def ref() -> Tensor:
        p = (n - 1) * torch.sigmoid(torch.tanh(F.linear(q, W_p)) @ w_p)  # [B, n_q]
        e = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)  # [B, n_q, n_k]
        return torch.bmm(local_align(e, p, D), v)

    g = torch.Generator().manual_seed(seed + 1)
    return Pair(
        name=f"local-p n={n}",
        attn=lambda: attn(q, k, v).context,
        ref=ref,
        leaves=[q, k, v, W_p, w_p],
        leaf_names=["q", "k", "v", "W_p", "w_p"],
        grad_out=torch.randn(B, n, d, generator=g),
        # the centre is (n_k - 1) sigmoid(...): these gradients are large, compare to scale
        overrides=_param_sums("W_p", "w_p"),
        info={"config": f"B={B} n_q=n_k={n} d={d} D={D}", "path": path, "n": n},
    )


# --------------------------------------------------------------------------- registry

CASES = ("sdpa", "additive", "multidim", "local")
ALIASES = {"multi-dim": "multidim", "multi": "multidim", "local-p": "local", "scaled-dot": "sdpa"}

# cases whose peak memory is measured in a fresh process per side
MEMORY_CASES = {"additive": additive_pair, "multidim": multidim_pair}
