"""Mistral checkpoints: Llama's layout plus a sliding attention window."""

from __future__ import annotations

from longboat.models.llm.adapters.llama import DenseAdapter
from longboat.models.llm.hf.adapter import register_hf_adapter


@register_hf_adapter("mistral")
class MistralAdapter(DenseAdapter):
    architecture = "MistralForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        out = super().config_from_hf(hf)
        # The decoder attends to the whole prefix. With sequences no longer than the window the window never
        # binds, so max_seq_len is capped at sliding_window: the import is exact wherever it runs at all.
        window = hf.get("sliding_window")
        if window is not None and window < out["max_seq_len"]:
            out["max_seq_len"] = window
        return out

    def config_to_hf(self, cfg) -> dict:
        self._require_dense(cfg)
        self._require(cfg, qkv_bias=False, qk_norm=False)
        return {**super().config_to_hf(cfg), "sliding_window": None}
