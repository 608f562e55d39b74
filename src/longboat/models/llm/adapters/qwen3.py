"""Qwen3 (dense) checkpoints: RMSNorm on each head's q and k."""

from __future__ import annotations

from longboat.models.llm.adapters.llama import DenseAdapter, is_dense
from longboat.models.llm.adapters.qwen2 import full_attention_only
from longboat.models.llm.hf.adapter import register_hf_adapter, reject


@register_hf_adapter("qwen3")
class Qwen3Adapter(DenseAdapter):
    architecture = "Qwen3ForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        full_attention_only(hf)
        reject(hf, "attention_bias", lambda v: not v, "Qwen3 models in longboat have no attention biases")
        return {**super().config_from_hf(hf), "qk_norm": True}

    def config_to_hf(self, cfg) -> dict:
        self._require_dense(cfg)
        self._require(cfg, qkv_bias=False, qk_norm=True)
        return {**super().config_to_hf(cfg), "attention_bias": False, "use_sliding_window": False}

    def default_for(self, cfg) -> bool:
        return is_dense(cfg) and cfg.qk_norm and not cfg.qkv_bias
