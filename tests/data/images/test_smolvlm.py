"""SmolVLM's preprocessing without tiles equals transformers' ``SmolVLMImageProcessorPil`` with
``do_image_splitting=False`` bit for bit, on images of odd sizes and aspect ratios, and is what a ``siglip`` tower's
vision-language model reads its images with."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from longboat.data.images.smolvlm import longest_edge_size, smolvlm_pixels
from tests.models.vlm.conftest import vlm_config

transformers = pytest.importorskip("transformers")

SIZES = [(37, 61), (80, 23), (32, 32), (5, 200), (301, 300), (1, 1)]


@pytest.mark.parametrize("longest_edge", [96, 5000])
def test_pixels_equal_the_transformers_processor(longest_edge):
    proc = transformers.SmolVLMImageProcessorPil(do_image_splitting=False, size={"longest_edge": longest_edge},
                                                 max_image_size={"longest_edge": 32})
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in SIZES]
    theirs = proc(images=[[image] for image in images], return_tensors="np")
    assert theirs["pixel_attention_mask"].all()
    for image, expected in zip(images, theirs["pixel_values"][:, 0]):
        ours = smolvlm_pixels(image, 32, longest_edge, proc.image_mean, proc.image_std)
        assert ours.dtype == np.float32 and np.array_equal(ours, expected), image.size


def test_first_resize_keeps_the_aspect_ratio_within_the_cap():
    assert longest_edge_size(37, 61, 96) == (58, 96)  # 96 / (61 / 37) = 58.2 -> 58, even
    assert longest_edge_size(61, 37, 96) == (96, 58)
    assert longest_edge_size(10, 30, 9000) == (1365, 4096)  # 9000 × 3000 capped: 4096 / 3 = 1365.3


def test_a_siglip_vlm_reads_its_images_so():
    cfg = vlm_config({"arch": "siglip", "image_size": 16, "patch_size": 4, "d_model": 32, "n_layers": 1,
                      "n_heads": 2}, {"kind": "pixel_shuffle"})
    processor = cfg.image_processor()
    assert cfg.image_tokens(300, 20) == 4 and processor.longest_edge == 64
    image = np.random.default_rng(1).integers(0, 256, (40, 24, 3), dtype=np.uint8)
    out = processor([image, image])["images"]
    assert out.shape == (2, 3, 16, 16)
    assert torch.equal(out[1], torch.from_numpy(smolvlm_pixels(image, 16, 64, (0.5,) * 3, (0.5,) * 3)))
    assert processor.empty()["images"].shape == (0, 3, 16, 16)
