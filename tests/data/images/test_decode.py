"""A bad image ends in one ``ImageError`` that names the image and why, never a traceback from deep in Pillow."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from longboat.data.images.decode import ImageError, open_image
from longboat.data.images.qwen_vl import QwenVLImageProcessor
from longboat.errors import LongboatError


def png_bytes(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def test_bytes_and_paths_decode_like_pil(tmp_path):
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8))
    path = tmp_path / "a.png"
    image.save(path)
    process = QwenVLImageProcessor()
    want = process([image]).pixel_values
    assert torch.equal(process([png_bytes(image)]).pixel_values, want)
    assert torch.equal(process([path]).pixel_values, want)
    assert torch.equal(process(str(path)).pixel_values, want)


def test_exif_orientation_is_applied():
    image = Image.fromarray(np.zeros((10, 30, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90°: the upright image is 30 high, 10 wide
    buf = io.BytesIO()
    image.save(buf, "JPEG", exif=exif)
    assert open_image(buf.getvalue()).size == (10, 30)


@pytest.mark.parametrize("bad, reason", [
    (b"not an image at all", "cannot read image 1 (19 bytes): cannot identify image file"),
    (b"", "cannot read image 1 (0 bytes)"),
])
def test_unreadable_bytes_are_one_error(bad, reason):
    good = png_bytes(Image.new("RGB", (8, 8)))
    with pytest.raises(ImageError) as e:
        QwenVLImageProcessor()([good, bad])
    assert isinstance(e.value, LongboatError)
    assert str(e.value).startswith(reason) and "\n" not in str(e.value)


def test_truncated_and_missing_files(tmp_path):
    data = png_bytes(Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)))
    with pytest.raises(ImageError, match=r"cannot read image 0 \(\d+ bytes\)"):
        QwenVLImageProcessor()([data[: len(data) // 2]])
    with pytest.raises(ImageError, match="cannot read image 0 .*missing.png"):
        QwenVLImageProcessor()([tmp_path / "missing.png"])


def test_unusable_inputs_name_what_was_expected():
    process = QwenVLImageProcessor()
    with pytest.raises(ImageError, match="uint8"):
        process([np.zeros((20, 20, 3), dtype=np.float32)])
    with pytest.raises(ImageError, match="C in 1, 3 or 4"):
        process([np.zeros((20, 20, 5), dtype=np.uint8)])
    with pytest.raises(ImageError, match="expected a PIL image"):
        process([42])
    with pytest.raises(ImageError, match="image 0: .*aspect ratio is above 200"):
        process([Image.new("RGB", (1000, 4))])
    with pytest.raises(ImageError, match="cannot convert image 0 \\(mode La\\) to RGB"):
        process([Image.new("La", (8, 8))])
    with pytest.raises(ImageError, match="no images"):
        process([])


def test_a_decompression_bomb_is_refused(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ImageError, match="decompression bomb"):
        open_image(png_bytes(Image.new("RGB", (40, 40))))
