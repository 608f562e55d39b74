"""What a vision-language model's images become: the placeholder tokens each takes and the pixels its tower reads.

A processor answers ``tokens(height, width)`` from an image's size alone (read from its header when the data is
prepared) and turns a list of images into the batch entries the model takes (``images``, and ``image_grid`` for
towers of variable resolution), decoding them then, in the loader's workers. ``empty()`` is the entries of a batch
without an image, so every batch has the same keys.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from longboat.data.images.decode import rgb_image
from longboat.data.images.qwen_vl import QwenVLImageConfig, QwenVLImageProcessor
from longboat.data.images.smolvlm import smolvlm_pixels


class ImageProcessor(Protocol):
    def tokens(self, height: int, width: int) -> int: ...
    def __call__(self, images: list[Any]) -> dict[str, torch.Tensor]: ...
    def empty(self) -> dict[str, torch.Tensor]: ...


class SquareImages:
    """Resized (bicubic) to ``size`` × ``size``, rescaled to [0, 1] and normalised: ``images`` [n, 3, size, size];
    each takes ``(size / patch / merge)²`` tokens whatever its size."""

    def __init__(self, size: int, patch_size: int, merge_size: int, mean: tuple, std: tuple):
        self.size, self.per_image = size, (size // patch_size // merge_size) ** 2
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)

    def tokens(self, height: int, width: int) -> int:
        return self.per_image

    def __call__(self, images: list[Any]) -> dict[str, torch.Tensor]:
        out = np.empty((len(images), 3, self.size, self.size), dtype=np.float32)
        for i, image in enumerate(images):
            rgb = rgb_image(image, f"image {i}").resize((self.size, self.size), Image.Resampling.BICUBIC)
            pixels = np.asarray(rgb, dtype=np.float32) / 255.0
            out[i] = ((pixels - self.mean) / self.std).transpose(2, 0, 1)
        return {"images": torch.from_numpy(out)}

    def empty(self) -> dict[str, torch.Tensor]:
        return {"images": torch.zeros(0, 3, self.size, self.size)}


class SmolVLMImages(SquareImages):
    """SmolVLM's preprocessing without tiles (``smolvlm.py``): the longest edge to ``longest_edge``, then the
    ``size`` square, both Lanczos; ``images`` [n, 3, size, size]."""

    def __init__(self, size: int, patch_size: int, merge_size: int, longest_edge: int, mean: tuple, std: tuple):
        super().__init__(size, patch_size, merge_size, mean, std)
        self.longest_edge = longest_edge

    def __call__(self, images: list[Any]) -> dict[str, torch.Tensor]:
        out = np.empty((len(images), 3, self.size, self.size), dtype=np.float32)
        for i, image in enumerate(images):
            out[i] = smolvlm_pixels(image, self.size, self.longest_edge, self.mean, self.std, f"image {i}")
        return {"images": torch.from_numpy(out)}


class QwenImages:
    """Qwen-VL's preprocessing (``qwen_vl.py``): ``images`` are patch rows, ``image_grid`` (t, h, w) per image."""

    def __init__(self, config: QwenVLImageConfig):
        self.processor = QwenVLImageProcessor(config)
        self.config = config

    def tokens(self, height: int, width: int) -> int:
        h, w = self.processor.grid(height, width)
        return h * w // self.config.merge_size**2

    def __call__(self, images: list[Any]) -> dict[str, torch.Tensor]:
        batch = self.processor(list(images))
        return {"images": batch.pixel_values, "image_grid": batch.image_grid_thw}

    def empty(self) -> dict[str, torch.Tensor]:
        c = self.config
        return {"images": torch.zeros(0, 3 * c.temporal_patch_size * c.patch_size**2),
                "image_grid": torch.zeros(0, 3, dtype=torch.int64)}
