"""SmolVLM's (Idefics3's) image preprocessing for one image a placeholder run, without splitting into tiles: equal
to transformers' ``SmolVLMImageProcessorPil`` with ``do_image_splitting=False``, on PIL and numpy alone.

The image's longest edge is resized (Lanczos) to ``longest_edge`` keeping the aspect ratio (the short side rounded
up to an even number, the result kept within 4096 pixels), then resized (Lanczos) to the tower's ``size`` square,
rescaled to [0, 1] and normalised. The splitting processor's tiles with row/column marker tokens are not made here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from longboat.data.images.decode import rgb_image

MAX_SIDE = 4096  # the processor's cap on either side after the first resize


def longest_edge_size(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """(height, width) with the longest side ``longest_edge`` and the other in proportion, rounded up to even."""
    ratio = width / height
    if width >= height:
        width, height = longest_edge, int(longest_edge / ratio)
        height += height % 2
    else:
        height, width = longest_edge, int(longest_edge * ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    ratio = width / height  # the cap keeps the rounded size's proportions
    if width >= height and width > MAX_SIDE:
        width, height = MAX_SIDE, int(MAX_SIDE / ratio)
    elif height > width and height > MAX_SIDE:
        height, width = MAX_SIDE, int(MAX_SIDE * ratio)
    return max(height, 1), max(width, 1)


def smolvlm_pixels(image: Any, size: int, longest_edge: int, mean, std, name: str = "image") -> np.ndarray:
    """One image -> [3, size, size] float32 pixels as SmolVLM's tower reads them."""
    rgb = rgb_image(image, name)
    height, width = longest_edge_size(rgb.height, rgb.width, longest_edge)
    rgb = rgb.resize((width, height), Image.Resampling.LANCZOS).resize((size, size), Image.Resampling.LANCZOS)
    pixels = (np.asarray(rgb, dtype=np.float64) * (1 / 255)).astype(np.float32)
    pixels = (pixels - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return pixels.transpose(2, 0, 1)
