"""Experts in two groups chosen by token type equal transformers' ERNIE-4.5-VL MoE block (text and vision experts of
different widths, selection biases, a shared expert) on batches of mixed, text-only and image-only tokens, and bad
settings fail naming what is wrong."""

from __future__ import annotations

import pytest
import torch

from longboat.models.moe import MoEConfig
from longboat.models.moe.modality import ModalityMoE

transformers = pytest.importorskip("transformers")

D, E, K = 32, 4, 2
ERNIE = dict(score_func="softmax", norm_topk_prob=True, topk_norm_min=1e-12, use_expert_bias=True,
             router_dtype="float32")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def hf_block():
    from transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe import Ernie4_5_VLMoeMoeBlock

    config = transformers.AutoConfig.for_model("ernie4_5_vl_moe", text_config=dict(
        hidden_size=D, num_attention_heads=2, moe_intermediate_size=[24, 16], moe_k=K, moe_num_experts=E,
        moe_num_shared_experts=2, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                   "mrope_section": [3, 3, 2]})).text_config
    torch.manual_seed(0)
    block = Ernie4_5_VLMoeMoeBlock(config).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.2 * torch.randn_like(p))
    return block


def ours_from(block) -> ModalityMoE:
    text = MoEConfig(d_model=D, n_experts=E, top_k=K, expert_ffn_dim=24, n_shared_experts=2, **ERNIE)
    vision = MoEConfig(d_model=D, n_experts=E, top_k=K, expert_ffn_dim=16, **ERNIE)
    layer = ModalityMoE(text, vision).eval()
    sd = {}
    for group in ("text", "vision"):
        theirs = getattr(block, f"{group}_moe")
        up = theirs.experts.gate_up_proj  # [E, 2·ffn, d], gate rows first
        sd[f"{group}.router.weight"] = theirs.gate.weight
        sd[f"{group}.router.expert_bias"] = theirs.gate.moe_statics.e_score_correction_bias[0]
        sd[f"{group}.experts.w13"] = up.unflatten(1, (2, -1))
        sd[f"{group}.experts.w2"] = theirs.experts.down_proj
    for ours, hf in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")):
        sd[f"shared_experts.{ours}.weight"] = getattr(block.shared_experts, hf).weight
    layer.load_state_dict(sd, strict=True)
    return layer


@pytest.mark.parametrize("kind", ["mixed", "text", "vision"])
def test_equal_to_transformers(kind):
    block = hf_block()
    layer = ours_from(block)
    x = torch.randn(2, 9, D, generator=torch.Generator().manual_seed(1))
    vision = {"mixed": torch.rand(2, 9, generator=torch.Generator().manual_seed(2)) < 0.4,
              "text": torch.zeros(2, 9, dtype=torch.bool), "vision": torch.ones(2, 9, dtype=torch.bool)}[kind]
    with torch.no_grad():
        want, _ = block(x, vision.long())
        got, aux = layer(x, vision)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert aux["load"].sum() == K * int((~vision).sum()) and aux["vision_load"].sum() == K * int(vision.sum())
    if kind == "mixed":  # both groups matter: each token through the other group's experts differs
        with torch.no_grad():
            swapped, _ = layer(x, ~vision)
        assert (swapped - got).abs().max() > 1e-3


def test_gradients_reach_both_groups():
    layer = ours_from(hf_block())
    x = torch.randn(1, 6, D)
    vision = torch.tensor([[False, True, True, False, True, False]])
    out, aux = layer(x, vision)
    (out.square().sum() + aux["loss"]).backward()
    assert layer.text.experts.w13.grad.abs().sum() > 0 and layer.vision.experts.w13.grad.abs().sum() > 0


def test_bad_settings_name_what_is_wrong():
    text = MoEConfig(d_model=D, n_experts=E, top_k=K, expert_ffn_dim=24, n_shared_experts=1)
    with pytest.raises(ValueError, match="d_model"):
        ModalityMoE(text, MoEConfig(d_model=16, n_experts=E, top_k=K, expert_ffn_dim=8))
    with pytest.raises(ValueError, match="shared experts"):
        ModalityMoE(text, MoEConfig(d_model=D, n_experts=E, top_k=K, expert_ffn_dim=8, n_shared_experts=1))
    with pytest.raises(ValueError, match="dropless"):
        ModalityMoE(text, MoEConfig(d_model=D, n_experts=E, top_k=K, expert_ffn_dim=8, capacity_factor=1.0))
