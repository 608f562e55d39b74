"""Qwen-VL image preprocessing equals transformers' ``Qwen2VLImageProcessorPil`` (the processor transformers picks
without torchvision): the same grids and pixel values within 1e-6 on odd sizes, colour modes and both pixel clamps."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from PIL import Image

from longboat.data.images.qwen_vl import (
    QWEN2_5_VL,
    QWEN3_VL,
    QwenVLImageConfig,
    QwenVLImageProcessor,
    QwenVLImages,
    smart_resize,
)

transformers = pytest.importorskip("transformers")


def hf_processor(cfg: QwenVLImageConfig):
    from transformers import Qwen2VLImageProcessorPil

    resample = {"bicubic": 3, "bilinear": 2, "nearest": 0, "lanczos": 1, "box": 4, "hamming": 5}[cfg.resample]
    return Qwen2VLImageProcessorPil(
        size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels}, patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size, merge_size=cfg.merge_size, image_mean=list(cfg.image_mean),
        image_std=list(cfg.image_std), resample=resample)


def assert_equal_to_hf(images, cfg: QwenVLImageConfig = QWEN2_5_VL, **hf_kwargs):
    want = hf_processor(cfg)(images=images, return_tensors="pt", **hf_kwargs)
    got = QwenVLImageProcessor(cfg)(images)
    assert got.image_grid_thw.tolist() == want["image_grid_thw"].tolist()
    assert got.pixel_values.shape == want["pixel_values"].shape and got.pixel_values.dtype == torch.float32
    assert (got.pixel_values - want["pixel_values"]).abs().max() <= 1e-6
    return got


def noise(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    shape = (height, width, channels) if channels > 1 else (height, width)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def smooth(height: int, width: int) -> Image.Image:
    """A gradient with a disc: resampling of real edges, not only noise."""
    y, x = np.mgrid[0:height, 0:width]
    r = (255 * x / max(width - 1, 1)).astype(np.uint8)
    g = (255 * y / max(height - 1, 1)).astype(np.uint8)
    b = np.where((y - height / 2) ** 2 + (x - width / 2) ** 2 < (min(height, width) / 3) ** 2, 230, 20)
    return Image.fromarray(np.stack([r, g, b.astype(np.uint8)], axis=-1))


@pytest.mark.parametrize("size", [(37, 91), (480, 640), (5, 300), (333, 333), (1023, 17), (2, 399), (700, 1000)])
def test_odd_sizes_and_aspect_ratios(size):
    assert_equal_to_hf([Image.fromarray(noise(*size)), smooth(*size)])


def test_a_batch_of_mixed_sizes_is_each_image_in_order():
    images = [Image.fromarray(noise(h, w, seed=h)) for h, w in [(64, 64), (300, 120), (29, 57), (512, 384)]]
    out = assert_equal_to_hf(images)
    assert out.tokens_per_image() == (out.image_grid_thw.prod(dim=1) // 4).tolist()
    parts = QwenVLImages.cat([QwenVLImageProcessor()(images[:1]), QwenVLImageProcessor()(images[1:])])
    assert torch.equal(parts.pixel_values, out.pixel_values) and torch.equal(parts.image_grid_thw, out.image_grid_thw)


def test_colour_modes_convert_as_transformers_does():
    rgba = Image.fromarray(noise(50, 70, 4))  # varying alpha: composited onto white
    palette = Image.fromarray(noise(40, 60)).convert("P")
    palette.info["transparency"] = 0
    images = [rgba, Image.fromarray(noise(45, 81, 1)), Image.fromarray(noise(61, 33)).convert("CMYK"),
              Image.fromarray(noise(30, 90, 4)).convert("LA"), palette, Image.fromarray(noise(33, 44)).convert("I")]
    assert [im.mode for im in images] == ["RGBA", "L", "CMYK", "LA", "P", "I"]
    assert_equal_to_hf(images)
    rgb = Image.fromarray(noise(40, 50))
    assert_equal_to_hf([rgb.convert(mode) for mode in ("1", "PA", "RGBa", "RGBX", "I;16", "F", "YCbCr", "HSV", "LAB")])


def test_arrays_numpy_hwc_and_torch_chw():
    hwc = [noise(41, 77, 3, 1), noise(41, 77, 4, 2), noise(20, 90, 1, 3)[..., None]]
    assert_equal_to_hf(hwc, input_data_format="channels_last")
    chw = [torch.from_numpy(a).permute(2, 0, 1).contiguous() for a in hwc]
    ours = QwenVLImageProcessor()(chw)
    assert torch.equal(ours.pixel_values, QwenVLImageProcessor()(hwc).pixel_values)


@pytest.mark.parametrize("size", [(1, 1), (3, 2), (10, 12), (56, 56)])
def test_tiny_images_grow_to_min_pixels(size):
    out = assert_equal_to_hf([Image.fromarray(noise(*size))])
    t, h, w = out.image_grid_thw[0].tolist()
    assert h * w * 14 * 14 >= QWEN2_5_VL.min_pixels and h % 2 == w % 2 == 0


def test_huge_images_shrink_to_max_pixels():
    big = Image.fromarray(noise(3100, 4500))  # 14M pixels, over Qwen2.5-VL's 12.8M
    out = assert_equal_to_hf([big])
    t, h, w = out.image_grid_thw[0].tolist()
    assert h * w * 14 * 14 <= QWEN2_5_VL.max_pixels
    small = QWEN2_5_VL.model_copy(update={"max_pixels": 28 * 28 * 64})  # and a tight budget on an ordinary photo
    out = assert_equal_to_hf([Image.fromarray(noise(768, 1024))], small)
    assert out.image_grid_thw[0, 1:].prod() * 14 * 14 <= small.max_pixels


def test_qwen3_vl_is_a_config_change():
    images = [smooth(300, 500), Image.fromarray(noise(70, 40))]
    out = assert_equal_to_hf(images, QWEN3_VL)
    assert out.pixel_values.shape[1] == 3 * 2 * 16 * 16


def test_other_resampling_and_settings():
    cfg = QwenVLImageConfig(resample="bilinear", merge_size=1, temporal_patch_size=1, min_pixels=100)
    assert_equal_to_hf([Image.fromarray(noise(47, 53))], cfg)


def test_config_from_preprocessor_config_json():
    hub = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
           "image_mean": list(QWEN2_5_VL.image_mean), "image_std": list(QWEN2_5_VL.image_std), "resample": 3,
           "image_processor_type": "Qwen2VLImageProcessor"}
    assert QwenVLImageConfig.from_hf(hub) == QWEN2_5_VL
    qwen3 = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
             "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    assert QwenVLImageConfig.from_hf(qwen3) == QWEN3_VL


def test_smart_resize_matches_transformers_on_a_sweep():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    rng = np.random.default_rng(0)
    for h, w in rng.integers(1, 6000, (2000, 2)).tolist():
        if max(h, w) / min(h, w) > 200:
            continue
        for factor, lo, hi in [(28, 3136, 12845056), (32, 65536, 16777216), (28, 3136, 1003520)]:
            assert smart_resize(h, w, factor, lo, hi) == hf_smart_resize(h, w, factor, lo, hi)
