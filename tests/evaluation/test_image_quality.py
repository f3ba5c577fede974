"""PSNR and SSIM (torchmetrics) against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab._optional import install_command

pytest.importorskip("torchmetrics", reason=install_command("torchmetrics"))

from attnlab.evaluation.image_quality import psnr, psnr_per_image, ssim, ssim_per_image


def test_psnr_by_hand() -> None:
    target = torch.full((2, 3, 8, 8), 0.5)
    preds = target.clone()
    preds[0] -= 0.25  # MSE 1/16 -> 10 log10(16) dB
    preds[1] -= 0.1  # MSE 1/100 -> 20 dB
    per = psnr_per_image(preds, target)
    assert per.tolist() == pytest.approx([10 * math.log10(16), 20.0])
    assert psnr(preds, target) == pytest.approx((10 * math.log10(16) + 20.0) / 2)
    # data range 2: R^2 = 4 scales the ratio by 4
    assert float(psnr_per_image(preds[:1], target[:1], data_range=2.0)[0]) == pytest.approx(
        10 * math.log10(64)
    )
    assert math.isinf(psnr(target, target))


def test_ssim_of_constant_images_is_the_luminance_term() -> None:
    # constant images have zero variance and covariance: SSIM = (2 a b + C1) / (a^2 + b^2 + C1)
    a, b, c1 = 0.5, 0.25, 0.01**2
    x = torch.full((1, 3, 16, 16), a)
    y = torch.full((1, 3, 16, 16), b)
    assert ssim(y, x) == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), rel=1e-6)
    noisy = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    assert ssim(noisy, noisy) == pytest.approx(1.0)
    blurred = (noisy + noisy.roll(1, -1)) / 2
    per = ssim_per_image(blurred, noisy)
    assert per.shape == (2,) and bool((per < 1).all())
    assert ssim(blurred, noisy) == pytest.approx(ssim(noisy, blurred))  # symmetric


def test_errors_name_the_argument() -> None:
    x = torch.zeros(1, 1, 16, 16)
    with pytest.raises(ValueError, match="must match"):
        psnr(x, torch.zeros(1, 1, 16, 15))
    with pytest.raises(TypeError, match="float tensor"):
        psnr(x.long(), x)
    with pytest.raises(ValueError, match="smaller than the SSIM window"):
        ssim(torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 8))
    assert ssim(torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 8), kernel_size=7) == 1.0


def test_ssim_window_follows_kernel_size() -> None:
    """torchmetrics sizes its Gaussian window from sigma alone: a smaller kernel_size must
    really give a smaller window (8 x 8 images crashed with the 11 x 11 one), and the
    default stays Wang et al.'s 11 x 11 window with sigma 1.5."""
    from torchmetrics.functional.image import structural_similarity_index_measure as tm_ssim

    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 1, 8, 8, generator=g)
    y = (x + 0.1 * torch.randn(2, 1, 8, 8, generator=g)).clamp(0, 1)
    small = ssim(x, y, kernel_size=7)
    assert 0.0 < small < 1.0
    big_x = torch.rand(2, 3, 16, 16, generator=g)
    big_y = (big_x + 0.1 * torch.randn(2, 3, 16, 16, generator=g)).clamp(0, 1)
    ref = float(tm_ssim(big_x, big_y, data_range=1.0))
    assert ssim(big_x, big_y) == pytest.approx(ref, abs=1e-6)
    assert ssim(big_x, big_y, kernel_size=5) != pytest.approx(ref, abs=1e-3)


def test_ssim_window_is_the_size_asked_for_up_to_43(monkeypatch) -> None:
    """Every odd kernel_size up to 43 is the size of the window torchmetrics convolves
    with (seen on its conv2d calls); beyond, its window from sigma would be smaller than
    asked (45 gives 43), so it is refused."""
    import torch.nn.functional as F

    seen: list[tuple[int, int]] = []
    conv2d = F.conv2d

    def spy(x, weight, *args, **kwargs):
        seen.append(tuple(weight.shape[-2:]))
        return conv2d(x, weight, *args, **kwargs)

    monkeypatch.setattr(F, "conv2d", spy)
    x = torch.rand(1, 1, 45, 45, generator=torch.Generator().manual_seed(1))
    y = (x + 0.05).clamp(0, 1)
    for k in range(3, 44, 2):
        seen.clear()
        assert 0.0 < ssim(x, y, kernel_size=k) < 1.0
        assert seen and set(seen) == {(k, k)}, (k, seen)
    with pytest.raises(ValueError, match="at most 43"):
        ssim(x, x, kernel_size=45)
