"""Images from what a user hands over (PIL images, encoded bytes, files, uint8 arrays), decoded once, or one error.

A file or bytes is decoded in full here (so a truncated or foreign file fails now, not halfway through a batch) and
turned upright by its EXIF orientation, as ``transformers.image_utils.load_image`` does. Arrays are uint8, numpy in
[H, W, C] and torch in [C, H, W] (each library's own convention), C in 1, 3 or 4, or [H, W] for grey.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from longboat.errors import LongboatError


class ImageError(LongboatError, ValueError):
    """An image that cannot be read or used: the message names which one and why."""


def _reason(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def open_image(source: Any, name: str = "image") -> Image.Image:
    """A PIL image, fully decoded, from a PIL image, bytes or a path; ``name`` says which in an error."""
    if isinstance(source, Image.Image):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        stream, what = io.BytesIO(bytes(source)), f"{name} ({len(source)} bytes)"
    elif isinstance(source, (str, os.PathLike)):
        stream, what = Path(source), f"{name} ({source})"
    else:
        raise ImageError(f"{name}: expected a PIL image, bytes, a path or a uint8 array, got {type(source).__name__}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # a bomb is refused, not decoded
            image = Image.open(stream)
            image.load()
        return ImageOps.exif_transpose(image)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"cannot read {what}: {_reason(e)}") from None


def rgb_image(source: Any, name: str = "image") -> Image.Image:
    """An RGB PIL image; transparency is composited onto white, as transformers' ``convert_to_rgb`` does."""
    if _is_array(source):
        return Image.fromarray(_array_to_rgb(source, name))
    image = open_image(source, name)
    try:
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            image = image.convert("RGBA")
            white = Image.new("RGBA", image.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, image).convert("RGB")
        return image.convert("RGB") if image.mode != "RGB" else image
    except (OSError, ValueError) as e:
        raise ImageError(f"cannot convert {name} (mode {image.mode}) to RGB: {_reason(e)}") from None


def _is_array(source: Any) -> bool:
    if isinstance(source, np.ndarray):
        return True
    torch = _torch()
    return torch is not None and isinstance(source, torch.Tensor)


def _torch():
    import sys

    return sys.modules.get("torch")  # a torch tensor can only exist when torch is loaded


def _array_to_rgb(source: Any, name: str) -> np.ndarray:
    """uint8 [H, W, 3] from a numpy [H, W(, C)] or torch [(C, )H, W] uint8 array (RGBA onto white, grey repeated)."""
    if isinstance(source, np.ndarray):
        array = source
        if array.ndim == 3 and array.shape[-1] not in (1, 3, 4):
            raise ImageError(f"{name}: a numpy image is [H, W, C] with C in 1, 3 or 4, got shape {array.shape}")
    else:
        array = source.detach().cpu().numpy()
        if array.ndim == 3:
            if array.shape[0] not in (1, 3, 4):
                raise ImageError(f"{name}: a torch image is [C, H, W] with C in 1, 3 or 4, got shape {array.shape}")
            array = np.moveaxis(array, 0, -1)
    if array.ndim not in (2, 3):
        raise ImageError(f"{name}: an image array has 2 or 3 dimensions, got shape {array.shape}")
    if array.dtype != np.uint8:
        raise ImageError(f"{name}: an image array is uint8 (0-255), got {array.dtype}")
    if min(array.shape[:2]) == 0:
        raise ImageError(f"{name}: an image has no pixels (shape {array.shape})")
    if array.ndim == 2:
        array = array[..., None]
    channels = array.shape[-1]
    if channels == 1:
        return np.repeat(array, 3, axis=-1)
    if channels == 4:  # transformers' blend onto white, rounded back to uint8
        alpha = array[..., 3:4] / 255
        return np.round(alpha * array[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return np.ascontiguousarray(array)
