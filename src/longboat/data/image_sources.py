"""Labelled images for image generators: scikit-learn's bundled 8×8 ``digits``, captioned ``shapes``, a folder of
class subfolders, or ``.jsonl`` / ``.parquet`` rows naming an image (a path relative to the file, or its bytes) with a
label or caption.

Every image is decoded once, when the source is opened, to ``image_size`` × ``image_size`` with ``channels``
channels and scaled to [-1, 1]; a source's images are small enough to hold whole (tens of thousands of thumbnails
fit in a few hundred MB). A file that cannot be read is counted and named; past ``max_malformed_fraction`` opening
fails naming the first bad files. Labels are class indices: a folder's class is its subfolder, classes in sorted
order; string labels in rows are classes in sorted order too, integer labels are taken as they are.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from PIL import Image
from pydantic import Field

from longboat.config.base import ConfigError, StrictModel
from longboat.data.images.decode import ImageError, open_image, rgb_image
from longboat.data.shapes import SHAPES, load_shapes
from longboat.data.source_files import check_malformed, held_out, read_rows, row_unit

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
DIGITS = "digits"
DIGITS_SIZE = 8
DIGITS_MAX = 16.0  # load_digits' pixel values run 0..16


class ImageSourceConfig(StrictModel):
    source: str = Field(description="'digits' (scikit-learn's bundled 8×8 digits), 'shapes' (captioned coloured "
                                    "shapes drawn here), a folder of class subfolders, or a .jsonl / .parquet file "
                                    "of rows")
    image_size: int = Field(default=8, gt=0, description="images are resized to image_size × image_size")
    channels: Literal[1, 3] = Field(default=1, description="1 (grey) or 3 (RGB)")
    valid_fraction: float = Field(default=0.2, ge=0, lt=1, description="share held out for validation")
    split_seed: int = Field(default=0, description="the held-out split's seed, fixed apart from the run's so every "
                                                   "run and every metric sees the same held-out images")
    max_malformed_fraction: float = Field(default=0.0, ge=0, le=1,
                                          description="share of unreadable images tolerated (skipped)")
    image_key: str = Field(default="image", description="rows: the image column (a path or bytes)")
    label_key: str = Field(default="label", description="rows: the label column (int or str); '' for none")
    caption_key: str = Field(default="caption", description="rows: the caption column, read when present")


@dataclass
class ImageSet:
    """Images [N, C, H, W] float32 in [-1, 1], their labels [N] (int64; -1 where a row has none) and captions."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    captions: list[str] | None = None
    malformed: list[str] = field(default_factory=list)  # what could not be read (skipped)
    names: list[str] | None = None  # where each image came from (a file, or a row of one)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def subset(self, index: torch.Tensor) -> ImageSet:
        pick = index.tolist()
        captions = None if self.captions is None else [self.captions[i] for i in pick]
        names = None if self.names is None else [self.names[i] for i in pick]
        return ImageSet(self.images[index], self.labels[index], self.classes, captions, self.malformed, names)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def open_images(cfg: ImageSourceConfig) -> ImageSet:
    """Every image of ``cfg.source``, decoded, resized and scaled."""
    if cfg.source == DIGITS:
        return load_digits(cfg.image_size, cfg.channels)
    if cfg.source == SHAPES:
        images, labels, classes, captions = load_shapes(cfg.image_size, cfg.channels)
        return ImageSet(images, labels, classes, captions)
    path = Path(cfg.source)
    if path.is_dir():
        return load_folder(path, cfg.image_size, cfg.channels, cfg.max_malformed_fraction)
    if path.is_file() and (path.name.endswith(".jsonl") or path.name.endswith(".parquet")):
        return load_rows(path, cfg)
    if not path.exists():
        raise ConfigError(f"data.source: {cfg.source}: no such folder or file (expected 'digits', a folder of class "
                          "subfolders, or a .jsonl / .parquet file)")
    raise ConfigError(f"data.source: {cfg.source}: expected 'digits', a folder of class subfolders, or a .jsonl / "
                      ".parquet file")


def open_split(cfg: ImageSourceConfig) -> tuple[ImageSet, ImageSet | None]:
    """(train, valid) of ``cfg.source``; valid is None when ``valid_fraction`` is 0."""
    images = open_images(cfg)
    if cfg.valid_fraction == 0:
        return images, None
    train, valid = held_out(len(images), cfg.valid_fraction, cfg.split_seed, cfg.source)
    return images.subset(train), images.subset(valid)


# ---- digits ----------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images [N, 8, 8], targets [N]), read once per process (scikit-learn parses a CSV each call)."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise ConfigError("data.source 'digits' needs scikit-learn: pip install 'longboat[diffusion]'") from None
    bunch = sklearn_digits()
    return bunch.images.astype(np.float32), bunch.target.astype(np.int64)


def load_digits(image_size: int = DIGITS_SIZE, channels: int = 1) -> ImageSet:
    """scikit-learn's bundled digits (1,797 images of 8×8, values 0..16), scaled to [-1, 1]."""
    raw, target = _sklearn_digits()
    images = torch.from_numpy(raw.copy()).unsqueeze(1) / DIGITS_MAX * 2 - 1  # [N, 1, 8, 8]
    if image_size != DIGITS_SIZE:
        images = torch.nn.functional.interpolate(images, size=(image_size, image_size), mode="bilinear",
                                                 align_corners=False, antialias=image_size < DIGITS_SIZE)
    if channels == 3:
        images = images.expand(-1, 3, -1, -1).contiguous()
    labels = torch.from_numpy(target.copy())
    return ImageSet(images.clamp(-1, 1), labels, [str(i) for i in range(10)])


# ---- decoding files ----------------------------------------------------------------------------------------------
def to_tensor(image: Image.Image, image_size: int, channels: int) -> torch.Tensor:
    """A PIL image as float32 [C, H, W] in [-1, 1], resized (bicubic) to image_size × image_size."""
    image = rgb_image(image)
    if channels == 1:
        image = image.convert("L")
    if image.size != (image_size, image_size):
        image = image.resize((image_size, image_size), Image.Resampling.BICUBIC)
    array = np.asarray(image, dtype=np.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 127.5 - 1


def _decode(source, name: str, image_size: int, channels: int) -> torch.Tensor | None:
    try:
        return to_tensor(open_image(source, name), image_size, channels)
    except ImageError:
        return None


def _stack(images: list[torch.Tensor], image_size: int, channels: int) -> torch.Tensor:
    return torch.stack(images) if images else torch.zeros(0, channels, image_size, image_size)


def load_folder(root: Path, image_size: int, channels: int, max_malformed_fraction: float = 0.0) -> ImageSet:
    """Images under ``root/<class>/``: classes are the subfolders in sorted order."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ConfigError(f"data.source: {root} has no class subfolders (expected {root}/<class>/<image files>)")
    images, labels, bad, names, total = [], [], [], [], 0
    for label, name in enumerate(classes):
        files = sorted(p for p in (root / name).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        for path in files:
            total += 1
            image = _decode(path, str(path), image_size, channels)
            if image is None:
                bad.append(str(path))
                continue
            images.append(image)
            labels.append(label)
            names.append(str(path))
    check_malformed(bad, total, max_malformed_fraction, str(root))
    return ImageSet(_stack(images, image_size, channels), torch.tensor(labels, dtype=torch.int64), classes,
                    malformed=bad, names=names)


def load_rows(path: Path, cfg: ImageSourceConfig) -> ImageSet:
    """Rows of a .jsonl or .parquet file: ``image_key`` a path (relative to the file) or the image's bytes,
    ``label_key`` an int or str label, ``caption_key`` a caption."""
    rows = read_rows(path)
    unit = row_unit(path)
    for number, row in enumerate(rows, 1):
        if cfg.image_key not in row:
            raise ConfigError(f"data.source: {path} {unit} {number} has no '{cfg.image_key}' (data.image_key); "
                              f"keys: {', '.join(row) or 'none'}")
    has_labels = bool(cfg.label_key) and any(row.get(cfg.label_key) is not None for row in rows)
    has_captions = any(row.get(cfg.caption_key) is not None for row in rows)
    names: list[str] = []
    if has_labels:
        values = [row.get(cfg.label_key) for row in rows]
        kinds = {type(v) for v in values}
        if kinds <= {int}:
            if min(values) < 0:
                raise ConfigError(f"data.source: {path}: label {min(values)} is negative; labels are class indices")
            names = [str(i) for i in range(max(values) + 1)]
        elif kinds <= {str}:
            names = sorted(set(values))
        else:
            raise ConfigError(f"data.source: {path}: '{cfg.label_key}' must be an int or a str in every row, found "
                              f"{', '.join(sorted(k.__name__ for k in kinds))}")
    index = {name: i for i, name in enumerate(names)}
    images, labels, captions, bad, item_names = [], [], [], [], []
    for number, row in enumerate(rows, 1):
        value = row[cfg.image_key]
        name = f"{path} {unit} {number}"
        if isinstance(value, dict) and "bytes" in value:  # datasets' Image feature as parquet stores it
            value = value["bytes"] if value["bytes"] is not None else value.get("path")
        if isinstance(value, str):
            value, name = path.parent / value, f"{path.parent / value} ({unit} {number})"
        image = _decode(value, name, cfg.image_size, cfg.channels) if value is not None else None
        if image is None:
            bad.append(name)
            continue
        images.append(image)
        item_names.append(name)
        label = row.get(cfg.label_key) if has_labels else None
        labels.append(-1 if label is None else (index[label] if isinstance(label, str) else int(label)))
        captions.append(str(row.get(cfg.caption_key) or ""))
    check_malformed(bad, len(rows), cfg.max_malformed_fraction, str(path))
    return ImageSet(_stack(images, cfg.image_size, cfg.channels), torch.tensor(labels, dtype=torch.int64), names,
                    captions if has_captions else None, bad, item_names)
