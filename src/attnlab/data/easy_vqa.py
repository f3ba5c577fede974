"""easy-VQA (Zhou 2020): 64x64 images of one coloured shape with questions about it.

The ``easy-vqa`` package (1.0, MIT licence, ``pip install easy-vqa``) ships its data as
files: ``easy_vqa/data/{train,test}/images/<id>.png`` (64x64 RGB, one shape -- circle,
rectangle or triangle -- in one of eight colours on a plain light background),
``easy_vqa/data/{train,test}/questions.json`` (``[question, answer, image_id]`` triples) and
``easy_vqa/data/answers.txt`` (the 13 answers: 8 colours, 3 shapes, yes, no). 4,000 train
images with 38,575 questions, 1,000 test images with 9,673 questions.

:func:`load_easy_vqa` finds the files through the package's location (its code is not run),
decodes the PNGs (with Pillow when it is installed, else with the small zlib decoder
:func:`read_png`) and returns an :class:`EasyVQA` with the package's train and test splits
and a dev split carved from train by a seeded split of the *images* (all questions about an
image stay in one split). The decoded images are cached as ``.npy`` files (never pickles)
in attnlab's cache folder (``$ATTNLAB_CACHE``, see :mod:`attnlab.data._cache`).

The package has no question types; :func:`question_type` derives them from the answer:
``"yes/no"``, ``"color"`` or ``"shape"``.

:func:`shape_region` gives the pixels of the shape (everything that is not background), the
region a correct attention should look at.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab._checks import check_number, check_path, check_seed
from attnlab.data._cache import cache_dir, write_atomic
from attnlab.data._common import (
    SPLIT_NAMES,
    DataFormatError,
    MissingDataError,
    assign_splits,
    check_split,
    package_file,
    package_version,
)

__all__ = [
    "EasyVQA",
    "VQASplit",
    "load_easy_vqa",
    "question_type",
    "read_png",
    "shape_region",
]

DISTRIBUTION = "easy-vqa"
MODULE = "easy_vqa"
IMAGE_SIZE = 64
COLORS = ("red", "green", "blue", "black", "gray", "teal", "brown", "yellow")
SHAPES = ("circle", "rectangle", "triangle")
_FORMAT = 1  # bump when the cached arrays change meaning


def question_type(answer: str) -> str:
    """``"yes/no"``, ``"color"`` or ``"shape"``: the kind of question an easy-VQA answer
    answers (the package does not store question types; the answer determines them)."""
    if answer in ("yes", "no"):
        return "yes/no"
    if answer in COLORS:
        return "color"
    if answer in SHAPES:
        return "shape"
    raise ValueError(f"{answer!r} is not an easy-VQA answer")


# ----------------------------------------------------------------------------- containers


@dataclass(frozen=True)
class VQASplit:
    """One split of a VQA dataset: images and the questions about them.

    Attributes:
        images: ``[N_images, H, W, 3]`` uint8 RGB.
        image_ids: ``[N_images]`` the source's image ids (file names).
        questions: ``N`` question strings.
        answers: ``N`` answer strings.
        question_images: ``[N]`` int, the row of ``images`` each question is about.
        question_types: ``N`` question types (see :func:`question_type`).
    """

    images: np.ndarray
    image_ids: np.ndarray
    questions: tuple[str, ...]
    answers: tuple[str, ...]
    question_images: np.ndarray
    question_types: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.questions)

    def image(self, i: int) -> np.ndarray:
        """The ``[H, W, 3]`` uint8 image of question ``i``."""
        return self.images[int(self.question_images[i])]

    def subset(self, indices: Sequence[int]) -> VQASplit:
        """The questions ``indices`` (in that order) with only the images they need."""
        idx = np.asarray(indices, dtype=np.int64)
        rows = self.question_images[idx] if len(idx) else np.zeros(0, dtype=np.int64)
        keep, new_rows = np.unique(rows, return_inverse=True)
        return VQASplit(
            images=self.images[keep],
            image_ids=self.image_ids[keep],
            questions=tuple(self.questions[i] for i in idx),
            answers=tuple(self.answers[i] for i in idx),
            question_images=new_rows.astype(np.int64).reshape(-1),
            question_types=tuple(self.question_types[i] for i in idx),
        )


@dataclass(frozen=True)
class EasyVQA:
    """The easy-VQA dataset: ``train``, ``dev`` (carved from the package's train images)
    and ``test`` (the package's test split), the answer classes (``answers.txt`` order)
    and the package version."""

    train: VQASplit
    dev: VQASplit
    test: VQASplit
    answers: tuple[str, ...]
    version: str

    def split(self, name: str) -> VQASplit:
        check_split(name, SPLIT_NAMES, none=False)
        return getattr(self, name)


# ----------------------------------------------------------------------------- PNG


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _png_chunks(data: bytes, path: object) -> tuple[tuple[int, ...], bytes]:
    """The IHDR fields and the joined IDAT data of a PNG file's bytes."""
    if not data.startswith(_PNG_SIGNATURE):
        raise DataFormatError("not a PNG file (bad signature)", path=path)
    pos, header, idat = len(_PNG_SIGNATURE), None, []
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if len(body) != length:
            raise DataFormatError(
                f"truncated PNG: chunk {kind!r} announces {length} bytes, {len(body)} remain",
                path=path,
            )
        pos += 12 + length
        if kind == b"IHDR":
            if length != 13:
                raise DataFormatError(f"PNG IHDR chunk of {length} bytes, not 13", path=path)
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None or not idat:
        raise DataFormatError("PNG without IHDR or IDAT chunks", path=path)
    return header, b"".join(idat)


def _unfilter_row(f: int, line: bytearray, prev: bytearray, channels: int) -> bool:
    """Undo PNG row filter ``f`` (0 none, 1 sub, 2 up, 3 average, 4 Paeth) in place;
    False for an unknown filter."""
    if f == 1:
        for i in range(channels, len(line)):
            line[i] = (line[i] + line[i - channels]) & 255
    elif f == 2:
        for i in range(len(line)):
            line[i] = (line[i] + prev[i]) & 255
    elif f == 3:
        for i in range(len(line)):
            left = line[i - channels] if i >= channels else 0
            line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
    elif f == 4:
        for i in range(len(line)):
            left = line[i - channels] if i >= channels else 0
            up_left = prev[i - channels] if i >= channels else 0
            line[i] = (line[i] + _paeth(left, prev[i], up_left)) & 255
    return f in (0, 1, 2, 3, 4)


def read_png(data: bytes | str | os.PathLike, *, path: object = None) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB or RGBA PNG into ``[H, W, 3]`` uint8 (alpha is
    dropped). A small pure-Python decoder (zlib + the five PNG row filters) so that no
    imaging library is needed; :class:`DataFormatError` for anything else."""
    if not isinstance(data, bytes):
        if not isinstance(data, str | os.PathLike):
            raise TypeError(f"data must be PNG bytes or a path, got {type(data).__name__}")
        path = data = check_path(data, "data")
        data = data.read_bytes()
    header, idat = _png_chunks(data, path)
    width, height, depth, color, _, _, interlace = header
    channels = {2: 3, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace != 0:
        raise DataFormatError(
            f"unsupported PNG (bit depth {depth}, colour type {color}, interlace {interlace}); "
            "read_png handles 8-bit non-interlaced RGB/RGBA (install Pillow for the rest)",
            path=path,
        )
    try:
        raw = zlib.decompress(idat)
    except zlib.error as error:
        raise DataFormatError(f"corrupt PNG data ({error})", path=path) from error
    stride = width * channels
    if len(raw) != height * (stride + 1):
        raise DataFormatError(
            f"PNG data has {len(raw)} bytes, expected {height * (stride + 1)}", path=path
        )
    out = bytearray(height * stride)
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if not _unfilter_row(f, line, prev, channels):
            raise DataFormatError(f"unknown PNG row filter {f} in row {y}", path=path)
        out[y * stride : (y + 1) * stride] = line
        prev = line
    image = np.frombuffer(bytes(out), dtype=np.uint8).reshape(height, width, channels)
    return np.ascontiguousarray(image[..., :3])


def _decoder():
    """Pillow's decoder when Pillow is installed (fast, C), else :func:`read_png`."""
    try:
        from PIL import Image
    except ImportError:
        return read_png

    def decode(path: Path) -> np.ndarray:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)

    return decode


# ----------------------------------------------------------------------------- regions


def shape_region(image: np.ndarray, *, threshold: int = 24) -> np.ndarray:
    """The shape's pixels of an easy-VQA image: a bool ``[H, W]`` mask, True where the
    pixel differs from the background colour by more than ``threshold`` in some channel.

    The background colour is the most frequent colour of the image's border (easy-VQA
    backgrounds are one plain colour; the shape may touch the border but never covers most
    of it). Anti-aliased edge pixels count as shape when they differ enough.

    ``image`` is ``[H, W, 3]`` (H, W >= 1), uint8 or float in [0, 1]; ``threshold`` a number
    in [0, 255) (from 255 on no pixel could count).
    """
    if (
        not isinstance(image, np.ndarray)
        or image.ndim != 3
        or image.shape[2] != 3
        or 0 in image.shape
    ):
        shape = getattr(image, "shape", type(image).__name__)
        raise ValueError(f"image has shape {shape}, expected [H, W, 3] with H, W >= 1")
    check_number(threshold, "threshold", low=0, high=255, open_high=True)
    img = image
    if img.dtype != np.uint8:
        if not np.issubdtype(img.dtype, np.floating):
            raise TypeError(f"image has dtype {img.dtype}, expected uint8 or float in [0, 1]")
        if not ((img >= 0) & (img <= 1)).all():
            raise ValueError(
                "image has float values outside [0, 1] (or NaN); expected uint8 or float in [0, 1]"
            )
        img = np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)
    border = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
    colors, counts = np.unique(border, axis=0, return_counts=True)
    background = colors[int(np.argmax(counts))].astype(np.int16)
    diff = np.abs(img.astype(np.int16) - background).max(axis=2)
    return diff > threshold


# ----------------------------------------------------------------------------- loading


def _root() -> Path:
    answers = package_file(MODULE, "data/answers.txt", distribution=DISTRIBUTION)
    return answers.parent


def _read_questions(path: Path) -> list[tuple[str, str, int]]:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DataFormatError(f"cannot read the questions ({error})", path=path) from error
    if not isinstance(payload, list):
        raise DataFormatError("expected a JSON list of [question, answer, image_id]", path=path)
    rows = []
    for i, item in enumerate(payload):
        ok = (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and isinstance(item[1], str)
            and isinstance(item[2], int)
        )
        if not ok:
            raise DataFormatError(
                f"item {i} is {item!r}, expected [question, answer, image_id]", path=path
            )
        rows.append((item[0], item[1], item[2]))
    return rows


def _image_files(folder: Path) -> dict[int, Path]:
    if not folder.is_dir():
        raise MissingDataError(
            f"{folder} is missing; reinstall the data with `pip install {DISTRIBUTION}`"
        )
    files = {}
    for entry in folder.iterdir():
        if entry.suffix == ".png" and entry.stem.isdigit():
            files[int(entry.stem)] = entry
    return files


def _load_images(
    split: str, files: dict[int, Path], questions: Path
) -> tuple[np.ndarray, np.ndarray]:
    """Images of one package split, ``[N, 64, 64, 3]`` uint8, in ascending id order; cached
    as .npy (keyed by the package version, the image count and the questions file)."""
    ids = np.array(sorted(files), dtype=np.int64)
    st = questions.stat()
    version = package_version(DISTRIBUTION) or "unknown"
    key = f"{split}-v{_FORMAT}-{version}-{len(ids)}-{int(ids.sum()) if len(ids) else 0}-{st.st_mtime_ns}"
    root = cache_dir()
    file = root / "easy_vqa" / f"images-{key}.npy" if root is not None else None
    if file is not None and file.is_file():
        try:
            images = np.load(file, allow_pickle=False)
            if images.shape == (len(ids), IMAGE_SIZE, IMAGE_SIZE, 3) and images.dtype == np.uint8:
                return images, ids
        except (OSError, ValueError):
            pass  # damaged: decode again
    decode = _decoder()
    images = np.zeros((len(ids), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for row, image_id in enumerate(ids):
        image = decode(files[int(image_id)])
        if image.shape != (IMAGE_SIZE, IMAGE_SIZE, 3):
            raise DataFormatError(
                f"image has shape {image.shape}, expected (64, 64, 3)", path=files[int(image_id)]
            )
        images[row] = image
    if file is not None:
        write_atomic(
            file,
            lambda out: np.save(out, images, allow_pickle=False),
            what="image cache",
            then="the PNGs will be decoded again next time",
        )
    return images, ids


def _package_split(root: Path, split: str, answers: tuple[str, ...]) -> VQASplit:
    qfile = root / split / "questions.json"
    if not qfile.is_file():
        raise MissingDataError(
            f"{qfile} is missing; reinstall the data with `pip install {DISTRIBUTION}`"
        )
    rows = _read_questions(qfile)
    files = _image_files(root / split / "images")
    images, ids = _load_images(split, files, qfile)
    row_of = {int(image_id): r for r, image_id in enumerate(ids)}
    known = set(answers)
    q_images = np.zeros(len(rows), dtype=np.int64)
    for i, (_, answer, image_id) in enumerate(rows):
        if answer not in known:
            raise DataFormatError(f"question {i} has the unknown answer {answer!r}", path=qfile)
        if image_id not in row_of:
            raise DataFormatError(f"question {i} is about the missing image {image_id}", path=qfile)
        q_images[i] = row_of[image_id]
    return VQASplit(
        images=images,
        image_ids=ids,
        questions=tuple(r[0] for r in rows),
        answers=tuple(r[1] for r in rows),
        question_images=q_images,
        question_types=tuple(question_type(r[1]) for r in rows),
    )


_MEMORY: dict[tuple[object, ...], EasyVQA] = {}


def load_easy_vqa(*, dev_fraction: float = 0.1, seed: int = 0) -> EasyVQA:
    """Load easy-VQA from the installed ``easy-vqa`` package.

    Args:
        dev_fraction: the fraction of the package's train *images* moved, with all their
            questions, to the dev split (default 0.1: 400 images, about 3,860 questions).
        seed: the seed of that split (:func:`attnlab.data._common.assign_splits` over the
            image ids).

    Returns :class:`EasyVQA` (train / dev / test :class:`VQASplit`, the 13 answers).
    Raises :class:`MissingDataError` naming ``pip install easy-vqa`` when the package is
    not installed.
    """
    dev_fraction = check_number(dev_fraction, "dev_fraction", low=0, high=1, open_high=True)
    seed = check_seed(seed, minimum=0)
    root = _root()
    version = package_version(DISTRIBUTION) or "unknown"
    key = (str(root), version, dev_fraction, seed)
    if key in _MEMORY:
        return _MEMORY[key]
    answer_file = root / "answers.txt"
    answers = tuple(
        line.strip()
        for line in answer_file.read_text(encoding="utf-8").splitlines()
        if line.strip()
    )
    if len(answers) != len(set(answers)) or not answers:
        raise DataFormatError("expected distinct answers, one a line", path=answer_file)
    full_train = _package_split(root, "train", answers)
    test = _package_split(root, "test", answers)
    which = assign_splits(
        [int(i) for i in full_train.image_ids],
        fractions=(1.0 - dev_fraction, dev_fraction, 0.0),
        seed=seed,
    )
    in_dev = np.array([w == "dev" for w in which], dtype=bool)
    q_dev = in_dev[full_train.question_images]
    train = full_train.subset(np.flatnonzero(~q_dev))
    dev = full_train.subset(np.flatnonzero(q_dev))
    data = EasyVQA(train=train, dev=dev, test=test, answers=answers, version=version)
    _MEMORY[key] = data
    return data
