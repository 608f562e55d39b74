"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL image preprocessing, equal to transformers' ``Qwen2VLImageProcessorPil``.

Each image is resized (Pillow, bicubic by default) to the nearest size whose sides are multiples of
``patch_size * merge_size`` with its pixel count within [min_pixels, max_pixels] (``smart_resize``), rescaled to
[0, 1], normalised with the family's mean and std, and cut into patches of ``C * T * P * P`` values: rows in
merge-block order (2×2 patches of one merged token adjacent), each still image repeated over the ``T = 2`` temporal
slots. ``pixel_values`` of a batch is every image's rows one after the other, ``image_grid_thw`` holds (1, H/P, W/P)
per image. Rescale and normalise are one exact 256-entry table per channel, applied while the uint8 pixels are laid
out as patches, so the result equals transformers' float64 rescale then float32 normalise bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from pydantic import Field, model_validator

from longboat.config.base import StrictModel
from longboat.data.images.decode import ImageError, rgb_image

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESAMPLE = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
            "bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS,
            "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING}
# transformers' PILImageResampling numbers, as preprocessor_config.json writes ``resample``
RESAMPLE_BY_NUMBER = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
MAX_ASPECT_RATIO = 200
CHUNK = 512  # patches normalised at a time


class QwenVLImageConfig(StrictModel):
    """The processor's settings; defaults are Qwen2.5-VL's ``preprocessor_config.json`` (``QWEN3_VL`` for Qwen3-VL)."""

    patch_size: int = Field(default=14, gt=0, description="pixels per patch side")
    temporal_patch_size: int = Field(default=2, gt=0, description="frames per patch; a still image is repeated")
    merge_size: int = Field(default=2, gt=0, description="patches per merged token side")
    min_pixels: int = Field(default=56 * 56, gt=0)
    max_pixels: int = Field(default=28 * 28 * 16384, gt=0)
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    rescale_factor: float = Field(default=1 / 255, gt=0)
    resample: Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"] = "bicubic"

    @model_validator(mode="after")
    def _check(self) -> QwenVLImageConfig:
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels ({self.min_pixels}) is above max_pixels ({self.max_pixels})")
        if any(s <= 0 for s in self.image_std):
            raise ValueError(f"image_std must be positive, got {self.image_std}")
        return self

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_hf(cls, pre: dict) -> QwenVLImageConfig:
        """From a ``preprocessor_config.json`` (``size`` or the older ``min_pixels``/``max_pixels`` keys)."""
        size = pre.get("size") or {}
        fields: dict[str, Any] = {
            "min_pixels": pre.get("min_pixels") or size.get("shortest_edge"),
            "max_pixels": pre.get("max_pixels") or size.get("longest_edge"),
            **{k: pre.get(k) for k in ("patch_size", "temporal_patch_size", "merge_size", "rescale_factor")},
            "image_mean": tuple(pre["image_mean"]) if "image_mean" in pre else None,
            "image_std": tuple(pre["image_std"]) if "image_std" in pre else None,
            "resample": RESAMPLE_BY_NUMBER.get(pre["resample"], pre["resample"]) if "resample" in pre else None,
        }
        for flag in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            if pre.get(flag) is False:
                raise ImageError(f"preprocessor_config.json: {flag}=false is not supported (the model expects it on)")
        return cls(**{k: v for k, v in fields.items() if v is not None})


QWEN2_5_VL = QwenVLImageConfig()
QWEN3_VL = QwenVLImageConfig(patch_size=16, min_pixels=65536, max_pixels=16777216,
                             image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 14 * 14 * 4 * 1280) -> tuple[int, int]:
    """The resized (height, width): multiples of ``factor``, pixels within [min, max], the aspect ratio nearly kept.

    The arithmetic is transformers' (and Qwen's) to the last rounding, so the grids agree."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageError(f"image of {width}x{height} pixels: the aspect ratio is above {MAX_ASPECT_RATIO}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass
class QwenVLImages:
    """A batch as the vision tower reads it: ``pixel_values`` [patches, C·T·P·P] float32 and
    ``image_grid_thw`` [images, 3] int64."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor

    @classmethod
    def cat(cls, batches: list[QwenVLImages]) -> QwenVLImages:
        """Several samples' images as one batch (what a collate function builds): rows and grids in order."""
        return cls(torch.cat([b.pixel_values for b in batches]), torch.cat([b.image_grid_thw for b in batches]))

    def tokens_per_image(self, merge_size: int = 2) -> list[int]:
        """Merged tokens (placeholders in the text) of each image."""
        return (self.image_grid_thw.prod(dim=1) // merge_size**2).tolist()


class QwenVLImageProcessor:
    """``processor(images)`` -> ``QwenVLImages``; images are PIL images, encoded bytes, paths or uint8 arrays."""

    def __init__(self, config: QwenVLImageConfig = QWEN2_5_VL):
        self.config = config
        v = np.arange(256, dtype=np.float64)
        rescaled = (v * config.rescale_factor).astype(np.float32)  # transformers rescales in float64, then float32
        mean = np.asarray(config.image_mean, dtype=np.float32)[:, None]
        std = np.asarray(config.image_std, dtype=np.float32)[:, None]
        self._table = ((rescaled[None, :] - mean) / std).astype(np.float32)  # [C, 256]: normalised value of a byte

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """Patches (rows, columns) an image of this size becomes."""
        c = self.config
        h, w = smart_resize(height, width, c.factor, c.min_pixels, c.max_pixels)
        return h // c.patch_size, w // c.patch_size

    def __call__(self, images: Any) -> QwenVLImages:
        if not isinstance(images, (list, tuple)):
            images = [images]
        if not images:
            raise ImageError("no images to preprocess")
        c = self.config
        rgb = [rgb_image(image, f"image {i}") for i, image in enumerate(images)]
        grids = []
        for i, image in enumerate(rgb):
            try:
                grids.append(self.grid(image.height, image.width))
            except ImageError as e:
                raise ImageError(f"image {i}: {e}") from None
        channels, t, p = 3, c.temporal_patch_size, c.patch_size
        out = np.empty((sum(h * w for h, w in grids), channels, t, p, p), dtype=np.float32)
        start = 0
        for image, (gh, gw) in zip(rgb, grids):
            n = gh * gw
            self._patches(image, gh, gw, out[start:start + n])
            start += n
        grid_thw = torch.tensor([[1, gh, gw] for gh, gw in grids], dtype=torch.int64)
        return QwenVLImages(torch.from_numpy(out.reshape(len(out), -1)), grid_thw)

    def _patches(self, image: Image.Image, gh: int, gw: int, out: np.ndarray) -> None:
        """Resize one RGB image and write its normalised patches into ``out`` [gh·gw, C, T, P, P]."""
        c = self.config
        p, m = c.patch_size, c.merge_size
        resized = np.asarray(image.resize((gw * p, gh * p), RESAMPLE[c.resample]))
        # [H, W, C] bytes as (block row, block col, row in block, col in block, C, y, x): merge-block order
        u8 = resized.reshape(gh // m, m, p, gw // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5).reshape(gh * gw, 3, p, p)
        for start in range(0, len(u8), CHUNK):  # chunks small enough that the temporal copy reads from cache
            rows, dst = u8[start:start + CHUNK], out[start:start + CHUNK]
            for ch in range(3):
                np.take(self._table[ch], rows[:, ch], out=dst[:, ch, 0], mode="clip")
            dst[:, :, 1:] = dst[:, :, :1]
