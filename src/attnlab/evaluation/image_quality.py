"""Image reconstruction quality (survey section 4.1, extrinsic evaluation of vision):
PSNR and SSIM of restored images against the originals, from torchmetrics
(``pip install torchmetrics``, in ``attnlab[eval]``).

* :func:`psnr`: peak signal-to-noise ratio ``10 log10(R^2 / MSE)`` in dB per image
  (``R`` the data range, ``MSE`` over its pixels and channels), averaged over the images.
  Identical images have infinite PSNR.
* :func:`ssim`: structural similarity (Wang et al. 2004) per image,
  ``SSIM(x, y) = (2 mu_x mu_y + C1)(2 sigma_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(sigma_x^2 +
  sigma_y^2 + C2))`` with local statistics under an 11 x 11 Gaussian window (sigma 1.5),
  ``C1 = (0.01 R)^2``, ``C2 = (0.03 R)^2``, averaged over positions and channels, then over
  the images. 1 means identical; it is at most 1.

Images are float tensors ``[N, C, H, W]`` (or one image ``[C, H, W]``) in ``[0, R]``.
Cost: O(N C H W) for PSNR, O(N C H W k) for SSIM (separable k x k window).

Sources: Z. Wang, A. C. Bovik, H. R. Sheikh and E. P. Simoncelli, "Image Quality
Assessment: From Error Visibility to Structural Similarity", IEEE TIP 2004; torchmetrics
(Lightning AI), https://lightning.ai/docs/torchmetrics.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab._checks import check_positive
from attnlab._optional import require

__all__ = ["psnr", "psnr_per_image", "ssim", "ssim_per_image"]

#: the largest odd kernel_size whose sigma (1.5 k / 11) torchmetrics turns into a k x k
#: window (2 int(3.5 sigma + 0.5) + 1 = k up to 43; 45 gives 43)
_LARGEST_WINDOW = 43


def _images(preds: Tensor, target: Tensor, data_range: float) -> tuple[Tensor, Tensor]:
    for name, x in (("preds", preds), ("target", target)):
        if not isinstance(x, Tensor) or not x.is_floating_point():
            what = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"{name} must be a float tensor [N, C, H, W], got {what}")
    if preds.shape != target.shape:
        raise ValueError(
            f"preds has shape {tuple(preds.shape)} but target has {tuple(target.shape)}; "
            "they must match"
        )
    if preds.dim() == 3:
        preds, target = preds[None], target[None]
    if preds.dim() != 4 or preds.shape[0] == 0:
        raise ValueError(
            f"images have shape {tuple(preds.shape)}, expected [N, C, H, W] (or [C, H, W]) "
            "with N >= 1"
        )
    check_positive(data_range, "data_range", error=ValueError)
    return preds.detach().double(), target.detach().double()


def psnr_per_image(preds: Tensor, target: Tensor, data_range: float = 1.0) -> Tensor:
    """PSNR in dB of each image ``[N]`` (``inf`` where an image is reproduced exactly)."""
    functional = require("torchmetrics.functional.image")
    p, t = _images(preds, target, data_range)
    return functional.peak_signal_noise_ratio(
        p, t, data_range=float(data_range), reduction="none", dim=(1, 2, 3)
    )


def psnr(preds: Tensor, target: Tensor, data_range: float = 1.0) -> float:
    """Mean over the images of their PSNR in dB (see the module docstring)."""
    return float(psnr_per_image(preds, target, data_range).mean())


def ssim_per_image(
    preds: Tensor, target: Tensor, data_range: float = 1.0, kernel_size: int = 11
) -> Tensor:
    """SSIM of each image ``[N]`` (Gaussian window ``kernel_size`` x ``kernel_size``,
    sigma ``1.5 * kernel_size / 11``: Wang et al.'s 11 x 11 window with sigma 1.5, scaled
    to the size asked for; the images must be at least that large). torchmetrics derives
    its Gaussian window's size from sigma alone (``2 int(3.5 sigma + 0.5) + 1``), so sigma
    is what sets the size here, and it does so up to ``kernel_size = 43``: a larger one is
    a ``ValueError``."""
    functional = require("torchmetrics.functional.image")
    p, t = _images(preds, target, data_range)
    if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size < 3:
        raise ValueError(f"kernel_size must be an odd int >= 3, got {kernel_size!r}")
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd, got {kernel_size}")
    if kernel_size > _LARGEST_WINDOW:
        raise ValueError(
            f"kernel_size must be at most {_LARGEST_WINDOW}, got {kernel_size}: torchmetrics "
            "sizes its Gaussian window from sigma = 1.5 * kernel_size / 11, which gives a "
            "smaller window beyond that"
        )
    if min(p.shape[-2:]) < kernel_size:
        raise ValueError(
            f"images of {p.shape[-2]}x{p.shape[-1]} pixels are smaller than the SSIM window "
            f"({kernel_size}); pass a smaller odd kernel_size"
        )
    out = functional.structural_similarity_index_measure(
        p,
        t,
        data_range=float(data_range),
        kernel_size=kernel_size,
        sigma=1.5 * kernel_size / 11,
        reduction="none",
    )
    return torch.as_tensor(out).reshape(-1)


def ssim(preds: Tensor, target: Tensor, data_range: float = 1.0, kernel_size: int = 11) -> float:
    """Mean over the images of their SSIM (see the module docstring)."""
    return float(ssim_per_image(preds, target, data_range, kernel_size).mean())
