"""The SigLIP tower equals transformers' ``SmolVLMVisionTransformer`` on a tiny random config: full-size images, and
smaller images padded into the batch with their patch masks (the bucketed positions); its weights round-trip
through the checkpoint's names."""

from __future__ import annotations

import pytest
import torch

from longboat.models.vision.siglip import (
    SigLIP,
    SigLIPConfig,
    bucket_positions,
    patch_mask_of,
    siglip_from_hf,
    siglip_to_hf,
)

transformers = pytest.importorskip("transformers")

TINY_HF = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
           "image_size": 28, "patch_size": 4}
OURS = {"image_size": 28, "patch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 2, "mlp_ratio": 2.0}


def towers():
    from transformers.models.smolvlm.modeling_smolvlm import SmolVLMVisionTransformer

    torch.manual_seed(0)
    hf = SmolVLMVisionTransformer(transformers.SmolVLMVisionConfig(**TINY_HF)).eval()
    with torch.no_grad():  # norms start at one and biases at zero: make every tensor matter
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = SigLIP(SigLIPConfig(**OURS)).eval()
    ours.load_state_dict(siglip_from_hf(hf.state_dict()))
    return hf, ours


def test_full_size_images_equal_transformers():
    hf, ours = towers()
    images = torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(images), hf(images).last_hidden_state, atol=1e-5, rtol=0)


def test_padded_smaller_images_equal_transformers():
    """Two images of 16×24 and 28×12 pixels padded to 28×24 in one batch: positions bucketed over the table, the
    padding neither attended to nor changing the real patches."""
    hf, ours = towers()
    g = torch.Generator().manual_seed(2)
    images, pixels = torch.zeros(2, 3, 28, 24), torch.zeros(2, 28, 24, dtype=torch.bool)
    images[0, :, :16, :24], pixels[0, :16, :24] = torch.randn(3, 16, 24, generator=g), True
    images[1, :, :28, :12], pixels[1, :28, :12] = torch.randn(3, 28, 12, generator=g), True
    mask = patch_mask_of(pixels, 4)
    assert mask.shape == (2, 7, 6) and int(mask[0].sum()) == 4 * 6 and int(mask[1].sum()) == 7 * 3
    with torch.no_grad():
        theirs = hf(images, patch_attention_mask=mask).last_hidden_state
        torch.testing.assert_close(ours(images, mask), theirs, atol=1e-5, rtol=0)


def test_full_grid_positions_are_the_identity():
    for grid in (1, 3, 7, 24, 27, 32, 64):
        ids = bucket_positions(torch.ones(1, grid, grid, dtype=torch.bool), grid)
        assert torch.equal(ids[0], torch.arange(grid * grid))


def test_weights_round_trip_through_hf_names():
    hf, ours = towers()
    back = siglip_to_hf(ours.state_dict())
    assert back.keys() == hf.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in hf.state_dict().items())
    with pytest.raises(KeyError, match="head"):
        siglip_from_hf({"head.probe": torch.zeros(1)})


def test_images_the_table_cannot_hold_are_refused():
    _, ours = towers()
    with pytest.raises(ValueError, match="at most 28x28"):
        ours(torch.zeros(1, 3, 32, 28))
    with pytest.raises(ValueError, match="patch_mask"):
        ours(torch.zeros(1, 3, 28, 28), torch.ones(1, 6, 7, dtype=torch.bool))
