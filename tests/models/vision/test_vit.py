import pytest
import torch

from longboat.config.base import ConfigError, validate
from longboat.models.vision import ViT, ViTConfig


def test_patch_tokens_shape_and_sample_independence():
    cfg = ViTConfig(patch_size=4, d_model=32, n_layers=2, n_heads=4)
    vit = ViT(cfg, (3, 16, 24)).eval()
    x = torch.randn(3, 3, 16, 24)
    y = vit(x)
    assert y.shape == (3, cfg.num_patches(16, 24), 32) == (3, 24, 32)
    torch.testing.assert_close(vit(x[1:2]), y[1:2], rtol=1e-5, atol=1e-5)
    # The learned position embedding tells patches apart: moving a patch changes the tokens, not just their order.
    rolled = vit(x.roll(4, dims=3))
    assert not torch.allclose(rolled.sort(dim=1).values, y.sort(dim=1).values, atol=1e-3)


def test_shapes_that_do_not_fit_fail():
    with pytest.raises(ValueError, match="4-pixel patches"):
        ViT(ViTConfig(patch_size=4, d_model=32, n_heads=4), (3, 18, 16))
    with pytest.raises(ConfigError, match="n_heads"):
        validate(ViTConfig, {"d_model": 30, "n_heads": 4})
