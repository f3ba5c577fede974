"""Generated mirror-symmetric mosaics with a hidden block: an inpainting task that only
non-local information solves (no package).

Each image is a ``size x size`` RGB mosaic of ``cell x cell`` squares of uniformly random
colours whose right half is the left half mirrored: pixel ``(y, x)`` equals its *twin*
``(y, size - 1 - x)``. One ``block x block`` square on one side (left or right, at random)
is hidden. Because the colours of neighbouring cells are independent, the hidden pixels
cannot be guessed from their surroundings (a local guess is at best the mean colour); their
only source is the twin block on the other side, at least ``2 * gap + 1`` columns away
from every hidden pixel (``gap`` = the distance of the block from the centre line). A
convolutional network whose receptive field is narrower than that cannot see the twin;
self-attention over the feature map can copy it. The data thus isolates what attention
adds to a small CNN (the lab's ``inpainting`` task).

Everything is drawn with numpy from a seed: the same arguments give the same images on
every machine. Cost: O(N size^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnlab._checks import check_int

__all__ = ["MirroredScenes", "make_mirrored_scenes", "mirror_twin"]


@dataclass(frozen=True)
class MirroredScenes:
    """A set of mirrored mosaics.

    Attributes:
        images: ``[N, size, size, 3]`` float32 in ``[0, 1]``, the full images (the targets).
        masks: ``[N, size, size]`` bool, True on the hidden block.
        boxes: ``[N, 2]`` int64, the (top, left) corner of each hidden block.
        block: the side of the hidden block in pixels.
    """

    images: np.ndarray
    masks: np.ndarray
    boxes: np.ndarray
    block: int

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def size(self) -> int:
        return int(self.images.shape[1])

    def twin_masks(self) -> np.ndarray:
        """``[N, size, size]`` bool: the mirror image of each hidden block (its twin)."""
        return self.masks[:, :, ::-1].copy()


def mirror_twin(y: int, x: int, size: int) -> tuple[int, int]:
    """The twin pixel of ``(y, x)`` in a ``size``-wide mirrored image: ``(y, size - 1 - x)``."""
    return y, size - 1 - x


def _check_sizes(size: int, cell: int, block: int, gap: int) -> None:
    for name, value in (("size", size), ("cell", cell), ("block", block)):
        check_int(value, name, 1, error=ValueError)
    check_int(gap, "gap", 0, error=ValueError)
    if size % 2 or (size // 2) % cell:
        raise ValueError(f"size must be even and size / 2 a multiple of cell, got {size}, {cell}")
    if block + gap > size // 2:
        raise ValueError(
            f"block + gap must be <= size / 2 (the block stays on one side), got "
            f"block={block}, gap={gap}, size={size}"
        )


def _mosaics(rng: np.random.Generator, n: int, size: int, cell: int) -> np.ndarray:
    half = size // 2 // cell
    colours = rng.random((n, size // cell, half, 3), dtype=np.float32)
    left = colours.repeat(cell, axis=1).repeat(cell, axis=2)
    return np.concatenate([left, left[:, :, ::-1]], axis=2)


def make_mirrored_scenes(
    n: int, seed: int, *, size: int = 16, cell: int = 2, block: int = 4, gap: int = 2
) -> MirroredScenes:
    """``n`` mirrored mosaics with one hidden block each (see the module docstring).

    Args:
        n: the number of images (``>= 0``). seed: the numpy seed.
        size: the image side (even; ``size / 2`` a multiple of ``cell``).
        cell: the side of the mosaic's squares of one colour.
        block: the side of the hidden square.
        gap: the least number of columns between the hidden block and the centre line
            (``block + gap <= size / 2``).

    Raises ValueError (one line) for sizes that do not fit together.
    """
    check_int(n, "n", 0, error=ValueError)
    _check_sizes(size, cell, block, gap)
    rng = np.random.default_rng(seed)
    images = _mosaics(rng, n, size, cell)
    tops = rng.integers(0, (size - block) // cell + 1, n) * cell
    lefts = rng.integers(0, (size // 2 - block - gap) // cell + 1, n) * cell
    right = rng.random(n) < 0.5
    lefts = np.where(right, size - block - lefts, lefts)
    masks = np.zeros((n, size, size), dtype=bool)
    for i in range(n):
        masks[i, tops[i] : tops[i] + block, lefts[i] : lefts[i] + block] = True
    boxes = np.stack([tops, lefts], axis=1).astype(np.int64)
    return MirroredScenes(images=images, masks=masks, boxes=boxes, block=block)
