"""Qwen2 / Qwen2.5 checkpoints: biases on q, k and v."""

from __future__ import annotations

from longboat.models.llm.adapters.llama import DenseAdapter, is_dense
from longboat.models.llm.hf.adapter import register_hf_adapter, reject


def full_attention_only(hf: dict) -> None:
    """Qwen's optional sliding-window layers change the function; refuse them by name."""
    reject(hf, "use_sliding_window", lambda v: not v, "the decoder has full attention in every layer")
    reject(hf, "layer_types", lambda v: all(t == "full_attention" for t in v or []),
           "the decoder has full attention in every layer")


@register_hf_adapter("qwen2")
class Qwen2Adapter(DenseAdapter):
    architecture = "Qwen2ForCausalLM"
    writes_head_dim = False  # Qwen2 derives head_dim from hidden_size

    def config_from_hf(self, hf: dict) -> dict:
        full_attention_only(hf)
        return {**super().config_from_hf(hf), "qkv_bias": True}

    def config_to_hf(self, cfg) -> dict:
        self._require_dense(cfg)
        self._require(cfg, qkv_bias=True, qk_norm=False)
        return {**super().config_to_hf(cfg), "use_sliding_window": False}

    def default_for(self, cfg) -> bool:
        return is_dense(cfg) and cfg.qkv_bias and not cfg.qk_norm
