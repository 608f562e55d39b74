"""Qwen3-MoE checkpoints: Qwen3 attention (per-head q/k RMSNorm) with softmax top-k experts."""

from __future__ import annotations

from longboat.models.llm.adapters.llama import DENSE_NAMES
from longboat.models.llm.adapters.mixtral import MoEAdapter, moe_names
from longboat.models.llm.adapters.qwen2 import full_attention_only
from longboat.models.llm.hf.adapter import HFConversionError, NameMap, register_hf_adapter, reject


@register_hf_adapter("qwen3_moe")
class Qwen3MoeAdapter(MoEAdapter):
    architecture = "Qwen3MoeForCausalLM"
    names = NameMap(DENSE_NAMES.pairs + moe_names("mlp"))

    def config_from_hf(self, hf: dict) -> dict:
        full_attention_only(hf)
        reject(hf, "attention_bias", lambda v: not v, "Qwen3 models in longboat have no attention biases")
        n, step = hf["num_hidden_layers"], hf.get("decoder_sparse_step", 1)
        n_experts = hf.get("num_experts") or hf.get("num_local_experts")  # v5 writes the latter
        if not n_experts:
            raise HFConversionError("config.json num_experts is 0: a dense model; import it as qwen3")
        only_mlp = set(hf.get("mlp_only_layers") or [])
        # transformers: layer i has experts iff i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
        dense = [i for i in range(n) if i in only_mlp or (i + 1) % step]
        moe = {
            "d_model": hf["hidden_size"], "n_experts": n_experts, "top_k": hf["num_experts_per_tok"],
            "expert_ffn_dim": hf["moe_intermediate_size"], "score_func": "softmax",
            "norm_topk_prob": bool(hf.get("norm_topk_prob", False)), "router_dtype": "input",
        }
        return {**super().config_from_hf(hf), "qk_norm": True, "moe": moe, "dense_layers": dense}

    def config_to_hf(self, cfg) -> dict:
        if cfg.attention != "gqa":
            raise HFConversionError("qwen3_moe has grouped-query attention; this model has attention='mla'")
        self._require(cfg, qkv_bias=False, qk_norm=True)
        self._require_moe(cfg, score_func="softmax", n_shared_experts=0, n_groups=1, routed_scaling_factor=1.0,
                          use_expert_bias=False)
        m = cfg.moe
        return super().config_to_hf(cfg) | {
            "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
            "num_experts": m.n_experts, "num_experts_per_tok": m.top_k, "moe_intermediate_size": m.expert_ffn_dim,
            "norm_topk_prob": m.norm_topk_prob, "decoder_sparse_step": 1, "mlp_only_layers": list(cfg.dense_layers),
        }

    def default_for(self, cfg) -> bool:
        return cfg.moe is not None and cfg.attention == "gqa" and cfg.qk_norm and not cfg.qkv_bias
