"""attnlab.general.padding.masked_mean: the library's one masked mean, against the mean
computed row by row over the real positions."""

from __future__ import annotations

import pytest
import torch

from attnlab.general.padding import clear_attention_inputs, masked_mean


def _reference(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row by row: the plain mean of the real positions, zeros for a row without one."""
    rows = []
    for b in range(x.shape[0]):
        real = x[b][mask[b if mask.shape[0] > 1 else 0]]
        rows.append(real.mean(0) if len(real) else x.new_zeros(x.shape[2:]))
    return torch.stack(rows)


@pytest.mark.parametrize("shape", [(3, 5, 4), (3, 5, 2, 3)])
def test_matches_the_row_by_row_mean(shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    mask = torch.tensor(
        [
            [True, False, True, True, False],
            [False, False, False, False, False],
            [True, True, True, True, True],
        ]
    )
    torch.testing.assert_close(masked_mean(x, mask), _reference(x, mask))
    kept = masked_mean(x, mask, keepdim=True)
    assert kept.shape == (shape[0], 1, *shape[2:])
    torch.testing.assert_close(kept.squeeze(1), _reference(x, mask))


def test_a_batch_one_mask_broadcasts():
    x = torch.randn(2, 4, 3)
    mask = torch.tensor([[True, False, False, True]])
    torch.testing.assert_close(masked_mean(x, mask), _reference(x, mask))


def test_no_mask_is_the_plain_mean_and_empty_rows_give_zeros():
    x = torch.randn(2, 4, 3)
    torch.testing.assert_close(masked_mean(x, None), x.mean(1))
    assert masked_mean(x, None, keepdim=True).shape == (2, 1, 3)
    empty = torch.zeros(2, 0, 3)
    assert torch.equal(masked_mean(empty, None), torch.zeros(2, 3))
    assert torch.equal(masked_mean(empty, None, keepdim=True), torch.zeros(2, 1, 3))
    assert torch.equal(masked_mean(empty, torch.zeros(2, 0, dtype=torch.bool)), torch.zeros(2, 3))


def test_padding_never_matters_nor_gets_gradient():
    x = torch.randn(2, 4, 3)
    x[0, 3] = float("nan")
    x[1, 0] = float("inf")
    x.requires_grad_(True)
    mask = torch.tensor([[True, True, True, False], [False, True, True, True]])
    out = masked_mean(x, mask)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad[0, 3], torch.zeros(3))
    assert torch.equal(x.grad[1, 0], torch.zeros(3))
    torch.testing.assert_close(x.grad[0, 0], torch.full((3,), 1 / 3))


def test_half_precision_keeps_the_dtype():
    x = torch.randn(2, 5, 3)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    out = masked_mean(x.half(), mask)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), _reference(x, mask), atol=2e-3, rtol=2e-3)


def test_clear_attention_inputs_self_attention_must_be_a_bool() -> None:
    q = k = v = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match=r"^self_attention must be a bool, got 'no'$"):
        clear_attention_inputs(q, k, v, None, self_attention="no")
