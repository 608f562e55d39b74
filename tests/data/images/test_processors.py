"""Image processors of the vision-language model: token counts from the size alone, pixels as the tower reads them,
and an empty batch shaped like a full one (so rows with and without images concatenate)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from longboat.data.images.processors import QwenImages, SquareImages
from longboat.data.images.qwen_vl import QwenVLImageConfig, QwenVLImageProcessor


def test_square_images_resize_rescale_and_normalise():
    square = SquareImages(16, 4, 2, (0.5, 0.4, 0.3), (0.2, 0.25, 0.5))
    assert square.tokens(100, 30) == 4 and square.tokens(16, 16) == 4
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (20, 12, 3), dtype=np.uint8)
    out = square([pixels, Image.fromarray(pixels).convert("L")])["images"]
    assert out.shape == (2, 3, 16, 16) and out.dtype == torch.float32
    resized = np.asarray(Image.fromarray(pixels).resize((16, 16), Image.Resampling.BICUBIC), np.float32) / 255
    expected = (resized - np.array([0.5, 0.4, 0.3], np.float32)) / np.array([0.2, 0.25, 0.5], np.float32)
    assert torch.allclose(out[0], torch.from_numpy(expected.transpose(2, 0, 1)))
    assert torch.cat([square.empty()["images"], out]).shape == (2, 3, 16, 16)


def test_qwen_images_are_the_qwen_processors():
    config = QwenVLImageConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=8192)
    qwen = QwenImages(config)
    image = np.random.default_rng(1).integers(0, 256, (40, 24, 3), dtype=np.uint8)
    reference = QwenVLImageProcessor(config)([image])
    out = qwen([image])
    assert torch.equal(out["images"], reference.pixel_values)
    assert torch.equal(out["image_grid"], reference.image_grid_thw)
    assert qwen.tokens(40, 24) == reference.tokens_per_image(2)[0]
    empty = qwen.empty()
    assert torch.cat([empty["images"], out["images"]]).shape == out["images"].shape
    assert torch.cat([empty["image_grid"], out["image_grid"]]).dtype == torch.int64
