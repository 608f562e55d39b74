"""The Qwen3-VL vision tower equals transformers' ``Qwen3VLVisionModel`` (merged tokens and DeepStack features) on a
tiny random config, its weights round-trip through the checkpoint's ``model.visual.*`` names, and bad settings fail
naming the field."""

from __future__ import annotations

import pytest
import torch

from longboat.models.llm.hf import HFConversionError
from longboat.models.vision.qwen3_vl import (
    Qwen3VisionConfig,
    Qwen3VisionTower,
    config_from_hf,
    config_to_hf,
    state_dict_from_hf,
    state_dict_to_hf,
)

TINY_HF = {"depth": 3, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 40,
           "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 16,
           "deepstack_visual_indexes": [0, 2]}
# Two images of different sizes, one larger and one smaller than the position table's 4x4, and a two-frame clip.
GRIDS = torch.tensor([[1, 6, 10], [1, 2, 4], [2, 4, 2]])


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def hf_tower(**changes):
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    config = transformers.Qwen3VLConfig(vision_config={**TINY_HF, **changes}).vision_config
    torch.manual_seed(0)
    model = Qwen3VLVisionModel(config).eval()
    with torch.no_grad():  # away from unit norms and zero biases
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("act", ["gelu_pytorch_tanh", "gelu"])
def test_equal_to_transformers(act):
    hf = hf_tower(hidden_act=act)
    tower = Qwen3VisionTower(config_from_hf({**TINY_HF, "hidden_act": act})).eval()
    tower.load_state_dict(state_dict_from_hf(hf.state_dict(), prefix=""), strict=True)
    pixels = torch.randn(int(GRIDS.prod(dim=1).sum()), 3 * 2 * 16 * 16)
    with torch.no_grad():
        want = hf(pixels, grid_thw=GRIDS)
        got, deepstack = tower(pixels, GRIDS)
    assert got.shape == want.pooler_output.shape == (int(GRIDS.prod(dim=1).sum()) // 4, 40)
    assert (got - want.pooler_output).abs().max() <= 1e-4
    assert len(deepstack) == 2
    for ours, theirs in zip(deepstack, want.deepstack_features):
        assert (ours - theirs).abs().max() <= 1e-4


def test_weights_and_config_round_trip():
    cfg = config_from_hf(TINY_HF)
    assert config_from_hf(config_to_hf(cfg)) == cfg
    tower = Qwen3VisionTower(cfg)
    hf = state_dict_to_hf(tower.state_dict(), cfg)
    assert hf["model.visual.patch_embed.proj.weight"].shape == (32, 3, 2, 16, 16)
    back = state_dict_from_hf(hf)
    assert back.keys() == tower.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in tower.state_dict().items())


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="num_position_embeddings"):
        Qwen3VisionConfig(num_position_embeddings=15)
    with pytest.raises(ValueError, match="deepstack_layers"):
        Qwen3VisionConfig(n_layers=2, deepstack_layers=(2,))
    with pytest.raises(HFConversionError, match="hidden_act"):
        config_from_hf({**TINY_HF, "hidden_act": "relu"})
    with pytest.raises(ValueError, match="do not match the grids"):
        Qwen3VisionTower(config_from_hf(TINY_HF))(torch.zeros(3, 3 * 2 * 16 * 16), GRIDS)
