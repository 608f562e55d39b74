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
    assert aux["load"][:E].sum() == K * int((~vision).sum()) and aux["load"][E:].sum() == K * int(vision.sum())
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


def test_decoder_equals_ernie_4_5_vl_language_model():
    """A decoder with ``vision_moe`` and ERNIE's 3-D RoPE (``mrope_alternating``) equals transformers'
    ``Ernie4_5_VLMoeTextModel``: a dense first layer, then experts routed by token type; q/k rows per head in
    rotate-half order."""
    from transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe import Ernie4_5_VLMoeTextModel

    from longboat.models.llm import DecoderConfig
    from longboat.models.llm.adapters.ernie4_5_moe import pairs_to_halves
    from longboat.models.llm.model import Decoder

    config = transformers.AutoConfig.for_model("ernie4_5_vl_moe", text_config=dict(
        vocab_size=64, hidden_size=D, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, moe_intermediate_size=[24, 16], moe_k=K, moe_num_experts=E, moe_num_shared_experts=2,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [3, 3, 2]},
    )).text_config
    torch.manual_seed(0)
    hf = Ernie4_5_VLMoeTextModel(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(0.2 * torch.randn_like(p))
    ours = Decoder(DecoderConfig(
        vocab_size=64, d_model=D, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=48, max_seq_len=64, norm_eps=1e-5,
        mrope_section=(2, 3, 3), mrope_alternating=True, dense_layers=[0],
        moe=MoEConfig(d_model=D, n_experts=E, top_k=K, expert_ffn_dim=24, n_shared_experts=2, **ERNIE),
        vision_moe=MoEConfig(d_model=D, n_experts=E, top_k=K, expert_ffn_dim=16, **ERNIE))).eval()
    block = hf.layers[1].mlp
    sd = {"tok_embeddings.weight": hf.embed_tokens.weight, "norm.weight": hf.norm.weight,
          "output.weight": ours.output.weight}
    for i, layer in enumerate(hf.layers):
        a, ours_a = layer.self_attn, f"layers.{i}.attention."
        sd[ours_a + "wq.weight"] = pairs_to_halves(a.q_proj.weight, 16)
        sd[ours_a + "wk.weight"] = pairs_to_halves(a.k_proj.weight, 16)
        sd[ours_a + "wv.weight"], sd[ours_a + "wo.weight"] = a.v_proj.weight, a.o_proj.weight
        sd[f"layers.{i}.attention_norm.weight"] = layer.input_layernorm.weight
        sd[f"layers.{i}.ffn_norm.weight"] = layer.post_attention_layernorm.weight
    for ours_name, hf_name in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")):
        sd[f"layers.0.feed_forward.{ours_name}.weight"] = getattr(hf.layers[0].mlp, hf_name).weight
    moe = {f"layers.1.feed_forward.{k}": v for k, v in ours_from(block).state_dict().items()}
    ours.load_state_dict(sd | moe, strict=True)
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(3))
    vision = torch.zeros(2, 10, dtype=torch.bool)
    vision[0, 2:8] = True  # a 2x3 image
    positions = torch.arange(10).expand(3, 2, 10).clone()
    positions[1, 0, 2:8] = torch.tensor([2, 2, 2, 3, 3, 3])
    positions[2, 0, 2:8] = torch.tensor([2, 3, 4, 2, 3, 4])
    positions[0, 0, 2:8] = 2
    positions[:, 0, 8:] = torch.tensor([5, 6])
    with torch.no_grad():
        want = hf(input_ids=tokens, position_ids=positions, moe_mm_token_type_ids=vision.long()).last_hidden_state
        got = ours.hidden_states(tokens, positions, vision=vision)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert len(ours.last_moe_aux) == 1 and ours.last_moe_aux[0]["load"].shape == (2 * E,)
