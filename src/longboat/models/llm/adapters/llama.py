"""Llama (2 and 3.x) checkpoints, and the dense-decoder mapping that Mistral and Qwen share."""

from __future__ import annotations

from longboat.models.llm.hf.adapter import (
    HFAdapter,
    HFConversionError,
    NameMap,
    register_hf_adapter,
    reject,
    rope_from_hf,
    rope_to_hf,
)

DENSE_NAMES = NameMap([
    ("model.embed_tokens.weight", "tok_embeddings.weight"),
    ("model.norm.weight", "norm.weight"),
    ("lm_head.weight", "output.weight"),
    ("model.layers.{i}.self_attn.q_proj.{p}", "layers.{i}.attention.wq.{p}"),
    ("model.layers.{i}.self_attn.k_proj.{p}", "layers.{i}.attention.wk.{p}"),
    ("model.layers.{i}.self_attn.v_proj.{p}", "layers.{i}.attention.wv.{p}"),
    ("model.layers.{i}.self_attn.o_proj.weight", "layers.{i}.attention.wo.weight"),
    ("model.layers.{i}.self_attn.q_norm.weight", "layers.{i}.attention.q_norm.weight"),
    ("model.layers.{i}.self_attn.k_norm.weight", "layers.{i}.attention.k_norm.weight"),
    ("model.layers.{i}.mlp.gate_proj.weight", "layers.{i}.feed_forward.w1.weight"),
    ("model.layers.{i}.mlp.down_proj.weight", "layers.{i}.feed_forward.w2.weight"),
    ("model.layers.{i}.mlp.up_proj.weight", "layers.{i}.feed_forward.w3.weight"),
    ("model.layers.{i}.input_layernorm.weight", "layers.{i}.attention_norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.ffn_norm.weight"),
])


def _false(v) -> bool:
    return not v


def is_dense(cfg) -> bool:
    """Every layer a SwiGLU MLP behind grouped-query attention: what the dense families can hold."""
    return getattr(cfg, "moe", None) is None and getattr(cfg, "attention", "gqa") == "gqa"


class DenseAdapter(HFAdapter):
    """Pre-norm RoPE decoder with a SwiGLU MLP: the fields every dense family shares."""

    names = DENSE_NAMES
    writes_head_dim = True

    def config_from_hf(self, hf: dict) -> dict:
        reject(hf, "hidden_act", lambda v: v == "silu", "the decoder's MLP is SwiGLU (silu)")
        reject(hf, "mlp_bias", _false, "the decoder's MLP has no biases")
        d, heads = hf["hidden_size"], hf["num_attention_heads"]
        out = {
            "vocab_size": hf["vocab_size"], "d_model": d, "n_layers": hf["num_hidden_layers"], "n_heads": heads,
            "n_kv_heads": hf.get("num_key_value_heads") or heads, "ffn_dim": hf["intermediate_size"],
            "max_seq_len": hf["max_position_embeddings"], "norm_eps": hf["rms_norm_eps"],
            "tie_embeddings": bool(hf.get("tie_word_embeddings", False)), **rope_from_hf(hf),
        }
        head_dim = hf.get("head_dim")
        if head_dim is not None and head_dim != d // heads:
            if not self.writes_head_dim:
                raise HFConversionError(
                    f"config.json head_dim={head_dim} differs from hidden_size // num_attention_heads = "
                    f"{d // heads}, which {self.model_type} models ignore it for")
            out["head_dim"] = head_dim
        return out

    def config_to_hf(self, cfg) -> dict:
        out = {
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.kv_heads, "max_position_embeddings": cfg.max_seq_len,
            "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu",
            **rope_to_hf(cfg),
        }
        if self.writes_head_dim:
            out["head_dim"] = cfg.head_size
        elif cfg.head_size != cfg.d_model // cfg.n_heads:
            raise HFConversionError(
                f"{self.model_type} requires head_dim == d_model // n_heads ({cfg.d_model // cfg.n_heads}), "
                f"got {cfg.head_size}")
        return out

    def _require_dense(self, cfg) -> None:
        if not is_dense(cfg):
            raise HFConversionError(f"{self.model_type} holds dense models only; this one has mixture-of-experts "
                                    "or MLA layers (choose mixtral, qwen3_moe or deepseek_v3)")

    def _require(self, cfg, qkv_bias: bool, qk_norm: bool) -> None:
        if cfg.qkv_bias != qkv_bias or cfg.qk_norm != qk_norm:
            raise HFConversionError(
                f"{self.model_type} has qkv_bias={qkv_bias}, qk_norm={qk_norm}; this model has "
                f"qkv_bias={cfg.qkv_bias}, qk_norm={cfg.qk_norm} (choose another family)")


@register_hf_adapter("llama")
class LlamaAdapter(DenseAdapter):
    architecture = "LlamaForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        # Llama's attention_bias also adds a bias to o_proj, which the decoder does not have.
        reject(hf, "attention_bias", _false, "the decoder's output projection has no bias")
        return super().config_from_hf(hf)

    def config_to_hf(self, cfg) -> dict:
        self._require_dense(cfg)
        self._require(cfg, qkv_bias=False, qk_norm=False)
        return {**super().config_to_hf(cfg), "attention_bias": False, "mlp_bias": False}

    def default_for(self, cfg) -> bool:
        return is_dense(cfg) and not cfg.qkv_bias and not cfg.qk_norm
