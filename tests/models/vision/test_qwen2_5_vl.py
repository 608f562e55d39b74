"""The Qwen2.5-VL vision tower equals transformers' ``Qwen2_5_VisionTransformerPretrainedModel`` on a tiny random
config, and its weights round-trip through the checkpoint's ``visual.*`` names."""

from __future__ import annotations

import pytest
import torch

from longboat.config.base import ConfigError, validate
from longboat.models.llm.hf import HFConversionError
from longboat.models.vision.qwen2_5_vl import (
    Qwen2_5_VisionConfig,
    Qwen2_5_VisionTower,
    config_from_hf,
    config_to_hf,
    state_dict_from_hf,
    state_dict_to_hf,
)

TINY_HF = {"depth": 4, "hidden_size": 64, "intermediate_size": 96, "num_heads": 4, "out_hidden_size": 48,
           "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
           "fullatt_block_indexes": [1, 3], "in_chans": 3, "hidden_act": "silu"}
# Two images of different sizes whose merged grids do not divide into whole windows, and a two-frame clip.
GRIDS = torch.tensor([[1, 10, 14], [1, 6, 4], [2, 4, 6]])


def hf_tower(attn: str = "sdpa", **changes):
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config = transformers.Qwen2_5_VLConfig(vision_config={**TINY_HF, **changes}).vision_config
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = Qwen2_5_VisionTransformerPretrainedModel(config).eval()
    with torch.no_grad():  # transformers initialises norms to one and biases to zero: make them matter
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def ours_from(hf_model, **changes) -> Qwen2_5_VisionTower:
    cfg = config_from_hf({**TINY_HF, **changes})
    tower = Qwen2_5_VisionTower(cfg).eval()
    tower.load_state_dict(state_dict_from_hf(hf_model.state_dict(), prefix=""), strict=True)
    return tower


@pytest.mark.parametrize("attn, window", [("sdpa", 56), ("eager", 56), ("sdpa", 112)])
def test_equal_to_transformers_on_images_of_different_sizes(attn, window):
    hf = hf_tower(attn, window_size=window)
    ours = ours_from(hf, window_size=window)
    pixels = torch.randn(int(GRIDS.prod(dim=1).sum()), 3 * 2 * 14 * 14)
    with torch.no_grad():
        want = hf(pixels, grid_thw=GRIDS).pooler_output
        got = ours(pixels, GRIDS)
    assert got.shape == want.shape == (int(GRIDS.prod(dim=1).sum()) // 4, 48)
    assert (got - want).abs().max() <= 1e-4


def test_gradients_equal_transformers():
    """Training the tower (or through it) sees transformers' gradients, for the pixels and for the weights."""
    hf = hf_tower()
    ours = ours_from(hf)
    pixels = torch.randn(int(GRIDS.prod(dim=1).sum()), 1176)
    weights = torch.randn(int(GRIDS.prod(dim=1).sum()) // 4, 48)
    x_hf, x_ours = pixels.clone().requires_grad_(), pixels.clone().requires_grad_()
    (hf(x_hf, grid_thw=GRIDS).pooler_output * weights).sum().backward()
    (ours(x_ours, GRIDS) * weights).sum().backward()
    assert (x_hf.grad - x_ours.grad).abs().max() <= 1e-4
    theirs = state_dict_from_hf({k: p.grad for k, p in hf.named_parameters()}, prefix="")
    for name, p in ours.named_parameters():
        assert (p.grad - theirs[name]).abs().max() <= 1e-4, name


def test_images_do_not_see_each_other_and_order_is_kept():
    """A batch's tokens are each image's tokens alone, in the input order: windows and images never mix."""
    ours = ours_from(hf_tower())
    sizes = GRIDS.prod(dim=1).tolist()
    pixels = torch.randn(sum(sizes), 3 * 2 * 14 * 14)
    with torch.no_grad():
        batch = ours(pixels, GRIDS)
        alone = [ours(p, g[None]) for p, g in zip(pixels.split(sizes), GRIDS)]
    torch.testing.assert_close(batch, torch.cat(alone), rtol=1e-5, atol=1e-5)


def test_weights_round_trip_through_checkpoint_names():
    hf = hf_tower()
    checkpoint = {f"visual.{k}": v for k, v in hf.state_dict().items()}
    checkpoint["model.embed_tokens.weight"] = torch.zeros(2, 2)  # the language model's tensors are not ours
    cfg = config_from_hf(TINY_HF)
    ours = state_dict_from_hf(checkpoint)
    assert set(ours) == set(Qwen2_5_VisionTower(cfg).state_dict())
    back = state_dict_to_hf(ours, cfg)
    assert back.keys() == {k for k in checkpoint if k.startswith("visual.")}
    assert all(torch.equal(back[k], checkpoint[k]) for k in back)
    assert back["visual.patch_embed.proj.weight"].shape == (64, 3, 2, 14, 14)
    assert config_from_hf(config_to_hf(cfg)) == cfg


def test_unknown_tensors_and_options_are_refused():
    with pytest.raises(HFConversionError, match="visual.blocks.0.attn.rope"):
        state_dict_from_hf({"visual.blocks.0.attn.rope": torch.zeros(1)})
    with pytest.raises(HFConversionError, match="hidden_act"):
        config_from_hf({**TINY_HF, "hidden_act": "gelu"})
    with pytest.raises(ConfigError, match="full_attention_layers"):
        validate(Qwen2_5_VisionConfig, {"n_layers": 2, "full_attention_layers": [3]})
    tower = Qwen2_5_VisionTower(config_from_hf(TINY_HF))
    with pytest.raises(ValueError, match="do not match the grids"):
        tower(torch.zeros(10, 1176), GRIDS)


def test_bf16_runs_and_stays_close():
    ours = ours_from(hf_tower())
    pixels = torch.randn(int(GRIDS.prod(dim=1).sum()), 1176)
    with torch.no_grad():
        want = ours(pixels, GRIDS)
        got = ours.to(torch.bfloat16)(pixels, GRIDS)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() < 0.1 * want.abs().max()


def test_preprocessed_images_feed_the_tower():
    """``data.images.qwen_vl`` output goes straight in: one token per merge block of each image, in order."""
    from PIL import Image

    from longboat.data.images.qwen_vl import QwenVLImageProcessor

    rng = torch.Generator().manual_seed(0)
    images = [Image.fromarray(torch.randint(0, 256, (h, w, 3), generator=rng, dtype=torch.uint8).numpy())
              for h, w in [(60, 90), (130, 50)]]
    batch = QwenVLImageProcessor()(images)
    hf = hf_tower()
    with torch.no_grad():
        tokens = ours_from(hf)(batch.pixel_values, batch.image_grid_thw)
        want = hf(batch.pixel_values, grid_thw=batch.image_grid_thw).pooler_output
    assert tokens.shape == (sum(batch.tokens_per_image()), 48)
    assert (tokens - want).abs().max() <= 1e-4
