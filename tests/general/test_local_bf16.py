"""bf16 accuracy of local-p / local-m (issue 12): the window centre and the Gaussian are
computed in float32, so bf16 only costs the rounding of the inputs, scores and output."""

from __future__ import annotations

import pytest
import torch

from attnlab import Attention

# bf16 has an 8-bit significand: the context (|c| <= ~2 here) is rounded to ~0.008, and the
# general score of bf16 inputs adds about as much again. Before the fix the centre itself
# was rounded in bf16 (S = 299 -> 300, p to multiples of 2) and the error was 0.3-0.7.
BF16_TOL = 0.03


@pytest.mark.parametrize("align", ["local-p", "local-m"])
@pytest.mark.parametrize("seed", [0, 1])
def test_local_bf16_matches_float64_of_the_same_inputs(align: str, seed: int) -> None:
    torch.manual_seed(seed)
    half = Attention("general", align, d_q=8, d_k=8, D=2).to(torch.bfloat16)
    ref_mod = Attention("general", align, d_q=8, d_k=8, D=2)
    ref_mod.load_state_dict(half.state_dict())
    ref_mod = ref_mod.double()
    # n_k = 300 > 256: positions beyond bf16's exact integers
    q = torch.randn(2, 300, 8).to(torch.bfloat16)
    k = torch.randn(2, 300, 8).to(torch.bfloat16)
    ref = ref_mod(q.double(), k.double()).context
    out = half(q, k)
    assert out.path == "local-window"
    assert out.context.dtype == torch.bfloat16
    err = (out.context.double() - ref).abs().max().item()
    assert err < BF16_TOL, f"{align} bf16 max error {err:.3g} vs float64"


def test_local_p_centres_are_float32_for_bf16_inputs() -> None:
    torch.manual_seed(0)
    attn = Attention("general", "local-p", d_q=8, d_k=8, D=2).to(torch.bfloat16)
    q = torch.randn(1, 3, 8).to(torch.bfloat16)
    out = attn(q, torch.randn(1, 300, 8).to(torch.bfloat16))
    assert out.extras["centers"].dtype == torch.float32
