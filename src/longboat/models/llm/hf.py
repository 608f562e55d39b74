"""Correspondence with transformers' Llama / Qwen2 / Qwen3 checkpoints: config fields and weight names.

Plain data and dict rewriting only; transformers itself is not imported here.
"""

from __future__ import annotations

from longboat.config.base import ConfigError
from longboat.models.llm.config import DecoderConfig

# HF name part -> ours; applied to each dot-separated part of a parameter name.
_NAME_PARTS = {
    "embed_tokens": "tok_embeddings",
    "self_attn": "attention",
    "q_proj": "wq",
    "k_proj": "wk",
    "v_proj": "wv",
    "o_proj": "wo",
    "mlp": "feed_forward",
    "gate_proj": "w1",
    "down_proj": "w2",
    "up_proj": "w3",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
    "lm_head": "output",
}


def hf_architecture(cfg: DecoderConfig) -> str:
    """The transformers class that computes the same function as ``Decoder(cfg)``."""
    if cfg.qk_norm:
        if cfg.qkv_bias:
            raise ConfigError("no transformers family has both qk_norm and qkv_bias")
        return "Qwen3ForCausalLM"
    if cfg.qkv_bias:
        if cfg.head_dim not in (None, cfg.d_model // cfg.n_heads):
            raise ConfigError("Qwen2 checkpoints require head_dim == d_model // n_heads")
        return "Qwen2ForCausalLM"
    return "LlamaForCausalLM"


def hf_config_dict(cfg: DecoderConfig) -> dict:
    """Keyword arguments for the transformers config class of ``hf_architecture(cfg)``."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope |= {
            "rope_type": s.type, "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    out = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "rope_parameters": rope,
        "hidden_act": "silu",
    }
    if hf_architecture(cfg) != "Qwen2ForCausalLM":
        out["head_dim"] = cfg.head_size
    return out


def from_hf_name(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``layers.0.attention.wq.weight``."""
    return ".".join(_NAME_PARTS.get(p, p) for p in name.removeprefix("model.").split("."))


def from_hf_state_dict(state: dict, cfg: DecoderConfig) -> dict:
    """Rename an HF state dict to ours; a tied head is dropped (ours reads the embedding table)."""
    out = {}
    for name, value in state.items():
        if name == "lm_head.weight" and cfg.tie_embeddings:
            continue
        out[from_hf_name(name)] = value
    return out
