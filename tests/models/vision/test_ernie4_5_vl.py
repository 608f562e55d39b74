"""The ERNIE-4.5-VL vision tower and resampler equal transformers' (``Ernie4_5_VLMoeVisionTransformerPretrainedModel``
then ``Ernie4_5_VLMoeVariableResolutionResamplerModel``) on a tiny random config, for images of odd sizes and for
videos of two and three frames; the weights round-trip through the names its checkpoints are saved with, and bad
settings fail naming the field."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from longboat.models.llm.hf import HFConversionError
from longboat.models.vision.ernie4_5_vl import (
    Ernie4_5VisionConfig,
    Ernie4_5VisionTower,
    config_from_hf,
    config_to_hf,
    state_dict_from_hf,
    state_dict_to_hf,
)

VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "patch_size": 14,
          "spatial_merge_size": 2}
TEXT = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "moe_intermediate_size": [32, 16], "moe_k": 2,
        "moe_num_experts": 4, "moe_num_shared_experts": 1, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]}}
# two images of odd grids (one wide, one tall), a two-frame and a three-frame clip (its last frame unpaired)
GRIDS = torch.tensor([[1, 6, 10], [1, 8, 4], [2, 4, 2], [3, 2, 4]])


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random transformers model, saved: (the model, its tensors as stored)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model("ernie4_5_vl_moe", vision_config=VISION, text_config=TEXT)
    torch.manual_seed(0)
    model = transformers.Ernie4_5_VLMoeForConditionalGeneration(config).eval()
    with torch.no_grad():  # away from unit norms and zero biases
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("ernie4_5_vl_moe")
    model.save_pretrained(path)
    return model, load_file(path / "model.safetensors")


def test_equal_to_transformers(checkpoint):
    hf, stored = checkpoint
    cfg = config_from_hf(hf.config.vision_config.to_dict(), hf.config.text_config.to_dict())
    assert cfg.out_dim == 64 and cfg.hidden_act == "quick_gelu"
    tower = Ernie4_5VisionTower(cfg).eval()
    tower.load_state_dict(state_dict_from_hf(stored), strict=True)
    pixels = torch.randn(int(GRIDS.prod(dim=1).sum()), 3 * 14 * 14)
    with torch.no_grad():
        features = hf.model.vision_tower(pixels, GRIDS).last_hidden_state
        want = hf.model.resampler_model(features, GRIDS)
        got = tower(pixels, GRIDS)
    tokens = [60 // 4, 32 // 4, 8 // 4, 8 // 4]  # per image; a clip's frames in pairs
    assert got.shape == want.shape == (sum(tokens), 64)
    assert (got - want).abs().max() <= 1e-4
    with torch.no_grad():  # an image's tokens do not depend on the others in the batch
        alone = tower(pixels[60:92], GRIDS[1:2])
    assert (alone - got[15:23]).abs().max() <= 1e-5


def test_weights_and_config_round_trip(checkpoint):
    hf, stored = checkpoint
    cfg = config_from_hf(VISION, TEXT)
    assert config_from_hf(config_to_hf(cfg), TEXT) == cfg
    tower = Ernie4_5VisionTower(cfg)
    out = state_dict_to_hf(tower.state_dict())
    assert out.keys() == {k for k in stored if k.startswith(("model.vision_model.", "model.resampler_model."))}
    assert all(out[k].shape == stored[k].shape for k in out)
    back = state_dict_from_hf(out)
    assert all(torch.equal(back[k], v) for k, v in tower.state_dict().items())


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="multiple of 4"):
        Ernie4_5VisionConfig(d_model=24, n_heads=4)
    with pytest.raises(HFConversionError, match="hidden_act"):
        config_from_hf({**VISION, "hidden_act": "relu"}, TEXT)
    with pytest.raises(HFConversionError, match="temporal_merge_size"):
        config_from_hf({**VISION, "temporal_merge_size": 3}, TEXT)
    with pytest.raises(HFConversionError, match="unknown vision tensor"):
        state_dict_from_hf({"model.vision_model.pos_embed": torch.zeros(1)})
    with pytest.raises(ValueError, match="do not match the grids"):
        Ernie4_5VisionTower(config_from_hf(VISION, TEXT))(torch.zeros(3, 3 * 14 * 14), GRIDS)
