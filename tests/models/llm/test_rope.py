"""RoPE scaling: Llama 3's and YaRN's frequencies, attention factors and logits against transformers beyond the
original context."""

from __future__ import annotations

import json

import pytest
import torch

from longboat.config.base import ConfigError, validate
from longboat.models.llm import DecoderConfig, load_preset
from longboat.models.llm.hf import load_hf_model, save_hf_model
from longboat.models.llm.rope import attention_factor, inverse_frequencies, softmax_scale_factor
from tests.models.llm.hf_reference import hf_config_dict

transformers = pytest.importorskip("transformers")

ORIGINAL = 16  # pretraining context of the tiny configs; the tests run 48 positions
TOKENS = torch.randint(0, 96, (2, 48), generator=torch.Generator().manual_seed(3))
COMMON = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, rms_norm_eps=1e-6, max_position_embeddings=64,
              tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=ORIGINAL)


@pytest.mark.parametrize("extra", [
    {},
    dict(beta_fast=16, beta_slow=2, truncate=False),
    dict(mscale=0.7, mscale_all_dim=1.0),
    dict(attention_factor=1.3, mscale=1.0, mscale_all_dim=1.0),
    dict(factor=None),  # transformers derives it: max_position_embeddings / original_max_position_embeddings
])
def test_yarn_frequencies_and_attention_factor_match_transformers(extra):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from longboat.models.llm.hf import get_hf_adapter

    hf_cfg = transformers.Qwen3Config(**COMMON, intermediate_size=48, num_hidden_layers=1, num_key_value_heads=2,
                                      head_dim=16, rope_parameters={**YARN, **extra})
    expected_freq, expected_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg)
    cfg = DecoderConfig(**get_hf_adapter("qwen3").config_from_hf(hf_cfg.to_dict()))
    torch.testing.assert_close(inverse_frequencies(16, cfg.rope_theta, cfg.rope_scaling), expected_freq,
                               rtol=1e-6, atol=0)
    assert attention_factor(cfg.rope_scaling) == pytest.approx(expected_factor, rel=1e-12)
    assert expected_factor != 1.0


def perturbed(hf_cfg):
    """A random transformers model with weights far enough from their init that positions matter."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return model


def qwen3(rope):
    return transformers.Qwen3Config(**COMMON, intermediate_size=48, num_hidden_layers=2, num_key_value_heads=2,
                                    head_dim=16, rope_parameters=rope)


def deepseek_v3(rope):
    return transformers.DeepseekV3Config(
        **COMMON, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, n_shared_experts=1,
        q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, rope_parameters=rope)


@pytest.mark.parametrize("family, make, extra", [
    ("qwen3", qwen3, dict(beta_fast=8, beta_slow=1)),
    ("deepseek_v3", deepseek_v3, dict(beta_fast=8, beta_slow=1, mscale=0.7, mscale_all_dim=1.0)),
])
def test_yarn_logits_match_transformers_beyond_the_original_context(family, make, extra, tmp_path):
    hf = perturbed(make({**YARN, **extra}))
    hf.save_pretrained(tmp_path / "hf")
    ours, cfg, got_family = load_hf_model(tmp_path / "hf")
    assert got_family == family and cfg.rope_scaling.type == "yarn" and cfg.rope_scaling.factor == 4.0
    if family == "deepseek_v3":  # MLA's softmax scale carries mscale_all_dim's correction
        assert softmax_scale_factor(cfg.rope_scaling) > 1.0
        assert ours.layers[0].attention.scale == pytest.approx(hf.model.layers[0].self_attn.scaling, rel=1e-12)
    with torch.no_grad():
        expected, got = hf(TOKENS).logits, ours(TOKENS)
        plain = perturbed(make(dict(rope_type="default", rope_theta=10000.0)))(TOKENS).logits
    assert TOKENS.shape[1] > 2 * ORIGINAL
    assert (plain[:, ORIGINAL:] - expected[:, ORIGINAL:]).abs().max() > 1e-2  # YaRN changes these positions
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)

    out = save_hf_model(ours, family, tmp_path / "out")
    written = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert written == {**YARN, **extra}
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS).logits, expected, atol=1e-4, rtol=1e-4)


SMALL = dict(vocab_size=64, d_model=32, n_layers=1, n_heads=4, ffn_dim=64)
GOOD = dict(type="yarn", factor=4.0, original_max_position_embeddings=16)


@pytest.mark.parametrize("change, message", [
    (dict(factor=0), "'model.rope_scaling.factor': Input should be greater than 0"),
    (dict(original_max_position_embeddings=-1), "'model.rope_scaling.original_max_position_embeddings'"),
    (dict(mscale_all_dim=-0.5), "'model.rope_scaling.mscale_all_dim'"),
    (dict(attention_factor=0.0), "'model.rope_scaling.attention_factor'"),
    (dict(beta_fast=1, beta_slow=2), r"rope_scaling.beta_fast \(1.0\) must be greater than beta_slow \(2.0\)"),
    (dict(low_freq_factor=1.0), "rope_scaling.low_freq_factor does not apply to type 'yarn'"),
    (dict(type="llama3", beta_fast=4, low_freq_factor=1.0, high_freq_factor=4.0),
     "rope_scaling.beta_fast does not apply to type 'llama3'"),
    (dict(type="llama3"), "rope_scaling.low_freq_factor is required with type 'llama3'"),
    (dict(truncat=False), "unknown key 'model.rope_scaling.truncat'; did you mean 'truncate'"),
])
def test_bad_rope_scaling_is_one_line_naming_the_field(change, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate(DecoderConfig, dict(SMALL, rope_scaling={**GOOD, **change}), "run.yaml", prefix="model")
    assert "\n" not in str(err.value)


def test_bad_yarn_value_in_config_json_names_the_field(tmp_path):
    perturbed(qwen3(YARN)).save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    hf["rope_parameters"]["beta_slow"] = -1
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ConfigError, match=r"config.json: 'model.rope_scaling.beta_slow'"):
        load_hf_model(tmp_path)


def test_rope_scaling_frequencies_match_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = DecoderConfig(**load_preset("llama3.1-8b"))
    hf_cfg = transformers.LlamaConfig(**hf_config_dict(cfg))
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg)
    got = inverse_frequencies(cfg.head_size, cfg.rope_theta, cfg.rope_scaling)
    assert torch.equal(got, expected)


# ---- multimodal RoPE ---------------------------------------------------------------------------------------------

MROPE = dict(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=64,
             mrope_section=(2, 3, 3))


@pytest.mark.parametrize("family, interleaved", [("qwen2_5_vl", False), ("qwen3_vl", True)])
def test_mrope_tables_equal_transformers_recomposition(family, interleaved):
    """cos and sin of [3, B, T] positions read each frequency from the row transformers' text rotary embedding does."""
    from longboat.models.llm.model import Decoder

    section = [4, 6, 6]
    config = transformers.AutoConfig.for_model(
        family, text_config=dict(hidden_size=128, num_attention_heads=4, head_dim=32,
                                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                  "mrope_section": section, "mrope_interleaved": interleaved}))
    rotary_cls = {"qwen2_5_vl": "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLRotaryEmbedding",
                  "qwen3_vl": "transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding"}[family]
    mod, name = rotary_cls.rsplit(".", 1)
    import importlib

    rotary = getattr(importlib.import_module(mod), name)(config.text_config)
    positions = torch.randint(0, 60, (3, 2, 7), generator=torch.Generator().manual_seed(0))
    want_cos, want_sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    decoder = Decoder(DecoderConfig(**{**MROPE, "d_model": 128, "head_dim": 32, "mrope_section": section,
                                       "mrope_interleaved": interleaved}))
    cos, sin = decoder._rope(7, positions, None)
    torch.testing.assert_close(cos, want_cos, atol=1e-6, rtol=0)
    # ours folds the sign of the first half into sin (apply_rope rolls instead of rotate_half)
    torch.testing.assert_close(sin, torch.cat([-want_sin[..., :16], want_sin[..., 16:]], -1), atol=1e-6, rtol=0)


def test_alternating_mrope_equals_ernie_4_5_vl_rotation():
    """ERNIE-4.5-VL's 3-D RoPE (pre-rotated height/width frequencies, adjacent-pair rotation) on q [B, H, T, D] equals
    ours (``mrope_alternating``) on the same q with each head's pairs in rotate-half order."""
    from transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeTextRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    from longboat.models.llm.model import Decoder
    from longboat.models.llm.rope import apply_rope

    config = transformers.AutoConfig.for_model(
        "ernie4_5_vl_moe", text_config=dict(hidden_size=128, num_attention_heads=4, head_dim=32, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [6, 6, 4]})).text_config  # h, w, t
    positions = torch.randint(0, 60, (3, 2, 7), generator=torch.Generator().manual_seed(0))
    q = torch.randn(2, 4, 7, 32, generator=torch.Generator().manual_seed(1))
    cos, sin = Ernie4_5_VLMoeTextRotaryEmbedding(config)(q, positions)
    want, _ = apply_rotary_pos_emb(q, q, cos, sin)

    def halves(x):  # adjacent pairs (2i, 2i+1) to (i, i + D/2)
        return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)

    decoder = Decoder(DecoderConfig(**{**MROPE, "d_model": 128, "head_dim": 32, "mrope_section": (4, 6, 6),
                                       "mrope_alternating": True}))
    ours = apply_rope(halves(q).transpose(1, 2), *decoder._rope(7, positions, None)).transpose(1, 2)
    torch.testing.assert_close(ours, halves(want), atol=1e-5, rtol=0)


def test_mrope_with_equal_rows_is_plain_rope_and_cache_keeps_positions():
    from longboat.models.llm.model import Decoder

    torch.manual_seed(0)
    decoder = Decoder(DecoderConfig(**MROPE)).eval()
    tokens = torch.randint(0, 96, (2, 12))
    plain = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(decoder(tokens, plain[None].expand(3, 2, 12)), decoder(tokens), atol=0, rtol=0)
        cache = decoder.make_cache(2, 32)
        decoder(tokens[:, :5], torch.stack([plain[:, :5], plain[:, :5] * 2, plain[:, :5] + 1]), cache)
        assert cache.next_position().tolist() == [9, 9]  # one past the largest row (8 = 2 · 4)
        cache.rewind(3)
        assert cache.next_position().tolist() == [5, 5]
        cache.rewind(0)
        assert cache.next_position().tolist() == [0, 0]
        decoder(tokens[:, :4], None, cache)  # 1-D decoding records its positions too
        assert cache.next_position().tolist() == [4, 4]


@pytest.mark.parametrize("change, message", [
    (dict(mrope_section=(2, 3, 4)), "must sum to head_dim / 2"),
    (dict(mrope_section=None, mrope_interleaved=True), "mrope_interleaved needs mrope_section"),
    (dict(mrope_section=(2, 3, 3), mrope_interleaved=True, mrope_alternating=True), "excludes mrope_interleaved"),
    (dict(mrope_section=(2, 4, 2), mrope_alternating=True), "equal height and width"),
])
def test_bad_mrope_is_one_line_naming_the_field(change, message):
    with pytest.raises(ConfigError, match=message):
        validate(DecoderConfig, {**MROPE, **change}, "test")


def test_multimodal_positions_need_mrope():
    from longboat.models.llm.model import Decoder

    decoder = Decoder(DecoderConfig(**{**MROPE, "mrope_section": None}))
    with pytest.raises(ValueError, match="no mrope_section"):
        decoder(torch.zeros(1, 3, dtype=torch.long), torch.zeros(3, 1, 3, dtype=torch.long))
