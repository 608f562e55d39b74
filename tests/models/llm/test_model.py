"""Decoder: logits parity with transformers, KV cache, meta-device init, config and presets."""

from __future__ import annotations

import math

import pytest
import torch

from longboat.config.base import ConfigError, validate
from longboat.models import build_model, model_names
from longboat.models.llm import Decoder, DecoderConfig, load_preset, preset_names
from tests.models.llm.hf_reference import from_hf_state_dict, hf_architecture, hf_config_dict

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, ffn_dim=96, max_seq_len=128)
LLAMA3_ROPE = dict(type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=32)
CASES = {
    "llama-gqa-untied-rope-scaled": dict(SMALL, n_kv_heads=2, rope_scaling=LLAMA3_ROPE, rope_theta=10000.0),
    "llama-mha-tied": dict(SMALL, tie_embeddings=True, rope_theta=500000.0),
    "qwen2-qkv-bias-tied": dict(SMALL, n_kv_heads=2, qkv_bias=True, tie_embeddings=True, norm_eps=1e-6),
    "qwen3-qk-norm-wide-heads": dict(SMALL, n_kv_heads=2, head_dim=32, qk_norm=True, norm_eps=1e-6),
}


def hf_pair(cfg_dict: dict, seed: int = 0):
    """A random transformers model (weights perturbed away from their trivial init) and ours with its weights."""
    cfg = DecoderConfig(**cfg_dict)
    arch = hf_architecture(cfg)
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    torch.manual_seed(seed)
    hf = getattr(transformers, arch)(config_cls(**hf_config_dict(cfg), attn_implementation="eager")).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    ours = Decoder(cfg).eval()
    ours.load_state_dict(from_hf_state_dict(hf.state_dict(), cfg), strict=True)
    return hf, ours


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(case):
    hf, ours = hf_pair(CASES[case])
    # 80 positions: beyond original_max_position_embeddings (32) of the scaled-RoPE case.
    tokens = torch.randint(0, 256, (2, 80), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours(tokens)
    assert expected.abs().mean() > 0.1  # random weights give non-trivial logits
    assert (got - expected).abs().max().item() <= 1e-4


def test_explicit_positions_equal_default():
    model = Decoder(DecoderConfig(**CASES["qwen3-qk-norm-wide-heads"])).eval()
    tokens = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        assert torch.allclose(model(tokens, torch.arange(12).expand(2, 12)), model(tokens), atol=1e-6)
        # RoPE sees only relative positions: a uniform shift changes nothing, a gap does.
        assert torch.allclose(model(tokens, torch.arange(5, 17).expand(2, 12)), model(tokens), atol=1e-5)
        gapped = model(tokens, (torch.arange(12) + 20 * (torch.arange(12) >= 6)).expand(2, 12))
    assert torch.allclose(gapped[:, :6], model(tokens)[:, :6], atol=1e-6)
    assert not torch.allclose(gapped[:, 6:], model(tokens)[:, 6:], atol=1e-3)


@pytest.mark.parametrize("case", ["llama-gqa-untied-rope-scaled", "llama-mha-tied"])
def test_kv_cache_matches_full_forward(case):
    model = Decoder(DecoderConfig(**CASES[case])).eval()
    tokens = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        full = model(tokens)
        cache = model.make_cache(2, 24)
        parts = [model(tokens[:, :8], cache=cache),  # prefill
                 model(tokens[:, 8:13], cache=cache)]  # second prefill chunk on top of the cache
        parts += [model(tokens[:, t : t + 1], cache=cache) for t in range(13, 20)]  # decode
    assert cache.length == 20
    assert (torch.cat(parts, dim=1) - full).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="overflow"):
        model(tokens[:, :5], cache=cache)


def test_an_explicit_mask_with_a_cache_replaces_the_causal_one():
    """A prefix read bidirectionally (a VLA's prefix-LM mask) while a cache receives its keys and values."""
    model = Decoder(DecoderConfig(**CASES["llama-gqa-untied-rope-scaled"])).eval()
    h = torch.randn(2, 6, model.cfg.d_model)
    cos, sin = model.rope_cos[:6], model.rope_sin[:6]
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    mask[0, :, :, -1] = False  # sample 0's last position is padding no one sees
    with torch.no_grad():
        cache = model.make_cache(2, 8)
        cached, _ = model.layers[0](h, cos, sin, cache, mask)
        plain, _ = model.layers[0](h, cos, sin, None, mask)
        causal, _ = model.layers[0](h, cos, sin)
    torch.testing.assert_close(cached, plain)
    assert not torch.allclose(causal[:, 0], plain[:, 0])  # position 0 sees the later ones
    h2 = h.clone()
    h2[0, -1] += 1.0
    with torch.no_grad():
        torch.testing.assert_close(model.layers[0](h2, cos, sin, None, mask)[0][0, :-1], plain[0, :-1])


def test_hidden_states_feed_the_output_head():
    for tied in (True, False):
        model = Decoder(DecoderConfig(**SMALL, tie_embeddings=tied)).eval()
        tokens = torch.randint(0, 256, (1, 6))
        with torch.no_grad():
            assert torch.allclose(model.hidden_states(tokens) @ model.output_weight.T, model(tokens), atol=1e-6)
        names = {n for n, _ in model.named_parameters()}
        assert ("output.weight" in names) is not tied


def test_init_weights_after_meta_build():
    cfg = DecoderConfig(**load_preset("tiny"), init_std=0.05)
    with torch.device("meta"):
        model = Decoder(cfg)
    assert model.tok_embeddings.weight.is_meta
    model.to_empty(device="cpu")
    model.init_weights()
    reference = Decoder(cfg)
    assert torch.equal(model.rope_cos, reference.rope_cos) and torch.equal(model.rope_sin, reference.rope_sin)
    assert "rope_cos" not in model.state_dict()
    out_std = 0.05 / math.sqrt(2 * cfg.n_layers)
    layer = model.layers[0]
    assert layer.attention.wq.weight.std().item() == pytest.approx(0.05, rel=0.05)
    assert layer.feed_forward.w1.weight.std().item() == pytest.approx(0.05, rel=0.05)
    assert model.tok_embeddings.weight.std().item() == pytest.approx(0.05, rel=0.02)
    assert layer.attention.wo.weight.std().item() == pytest.approx(out_std, rel=0.05)
    assert layer.feed_forward.w2.weight.std().item() == pytest.approx(out_std, rel=0.05)
    assert torch.equal(layer.attention_norm.weight, torch.ones(cfg.d_model))
    assert torch.equal(model.norm.weight, torch.ones(cfg.d_model))
    logits = model(torch.randint(0, cfg.vocab_size, (2, 32)))
    assert torch.isfinite(logits).all()


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="multiple of n_kv_heads"):
        validate(DecoderConfig, dict(SMALL, n_heads=6, n_kv_heads=4))
    with pytest.raises(ConfigError, match="set head_dim explicitly"):
        validate(DecoderConfig, dict(SMALL, n_heads=6))
    with pytest.raises(ConfigError, match="must be even"):
        validate(DecoderConfig, dict(SMALL, head_dim=15))
    with pytest.raises(ConfigError, match="did you mean 'n_kv_heads'"):
        validate(DecoderConfig, dict(SMALL, n_kv_head=2))
    with pytest.raises(ConfigError, match="rope_scaling.original_max_position_embeddings"):
        validate(DecoderConfig, dict(SMALL, rope_scaling={**LLAMA3_ROPE, "original_max_position_embeddings": 0}))
    with pytest.raises(ConfigError, match="high_freq_factor"):
        validate(DecoderConfig, dict(SMALL, rope_scaling={**LLAMA3_ROPE, "high_freq_factor": 0.5}))


def test_registry_and_presets():
    assert "decoder" in model_names()
    model = build_model("decoder", load_preset("tiny"))
    assert isinstance(model, Decoder)
    with pytest.raises(ConfigError, match="known: .*decoder"):
        build_model("no-such-arch", {})
    with pytest.raises(ConfigError, match="known: .*llama3.2-1b"):
        load_preset("llama-9000")
    expected = {"tiny", "llama3.2-1b", "llama3.1-8b", "llama3-8b", "qwen2.5-0.5b", "qwen3-0.6b",
                "qwen3-1.7b", "smollm2-135m"}
    assert expected <= set(preset_names())
    for name in preset_names():
        validate(DecoderConfig, load_preset(name), source=name)


@pytest.mark.parametrize(("name", "known"), [("llama3.2-1b", 1_235_814_400), ("qwen3-0.6b", 596_049_920),
                                             ("qwen2.5-0.5b", 494_032_768), ("smollm2-135m", 134_515_008)])
def test_num_params_matches_transformers(name, known):
    cfg = DecoderConfig(**load_preset(name))
    arch = hf_architecture(cfg)
    hf_cfg = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**hf_config_dict(cfg))
    with torch.device("meta"):
        hf = getattr(transformers, arch)(hf_cfg)
        ours = Decoder(cfg)
    assert cfg.num_params() == sum(p.numel() for p in hf.parameters()) == known
    assert cfg.num_params() == sum(p.numel() for p in ours.parameters())
    head = cfg.vocab_size * cfg.d_model
    assert cfg.num_params(include_embeddings=False) == known - head * (1 if cfg.tie_embeddings else 2)


def test_flops_per_token():
    cfg = DecoderConfig(**load_preset("tiny"))
    n = cfg.num_params(include_embeddings=False) + cfg.vocab_size * cfg.d_model
    assert cfg.flops_per_token(512) == 6 * n + 12 * 4 * 4 * 64 * 512
