"""DeepSeek-V3 checkpoints: multi-head latent attention, sigmoid group-limited experts with a selection bias,
shared experts, and dense feed-forwards in the first ``first_k_dense_replace`` layers.

YaRN rope scaling (the published V3 config's 128K context) is carried both ways, with its ``mscale_all_dim``
correction of the attention softmax scale. Not supported: FP8 block-quantised weights, and the
multi-token-prediction layers stored after the last decoder layer.
"""

from __future__ import annotations

from longboat.models.llm.adapters.llama import DENSE_NAMES
from longboat.models.llm.adapters.mixtral import MoEAdapter, moe_names
from longboat.models.llm.hf.adapter import (
    HFConversionError,
    NameMap,
    register_hf_adapter,
    reject,
    rope_from_hf,
    rope_to_hf,
)

_KEEP = ("embed_tokens", "model.norm", "lm_head", "mlp.", "layernorm.weight")  # dense names MLA layers reuse
MLA_NAMES = [
    ("model.layers.{i}.self_attn.q_proj.weight", "layers.{i}.attention.q_proj.weight"),
    ("model.layers.{i}.self_attn.q_a_proj.weight", "layers.{i}.attention.q_a_proj.weight"),
    ("model.layers.{i}.self_attn.q_a_layernorm.weight", "layers.{i}.attention.q_a_layernorm.weight"),
    ("model.layers.{i}.self_attn.q_b_proj.weight", "layers.{i}.attention.q_b_proj.weight"),
    ("model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight", "layers.{i}.attention.kv_a_proj_with_mqa.weight"),
    ("model.layers.{i}.self_attn.kv_a_layernorm.weight", "layers.{i}.attention.kv_a_layernorm.weight"),
    ("model.layers.{i}.self_attn.kv_b_proj.weight", "layers.{i}.attention.kv_b_proj.weight"),
    ("model.layers.{i}.self_attn.o_proj.weight", "layers.{i}.attention.wo.weight"),
]


@register_hf_adapter("deepseek_v3")
class DeepseekV3Adapter(MoEAdapter):
    architecture = "DeepseekV3ForCausalLM"
    names = NameMap([p for p in DENSE_NAMES.pairs if any(k in p[0] for k in _KEEP)] + MLA_NAMES
                    + moe_names("mlp", shared=True))

    def config_from_hf(self, hf: dict) -> dict:
        reject(hf, "hidden_act", lambda v: v == "silu", "the decoder's MLP is SwiGLU (silu)")
        reject(hf, "attention_bias", lambda v: not v, "the latent projections have no biases")
        reject(hf, "moe_layer_freq", lambda v: v == 1, "transformers puts experts in every layer after the dense ones")
        reject(hf, "scoring_func", lambda v: v == "sigmoid", "DeepSeek-V3 routes with sigmoid scores")
        reject(hf, "topk_method", lambda v: v == "noaux_tc", "DeepSeek-V3 routes with noaux_tc")
        n, first_dense = hf["num_hidden_layers"], hf.get("first_k_dense_replace", 0)
        moe = {
            "d_model": hf["hidden_size"], "n_experts": hf["n_routed_experts"], "top_k": hf["num_experts_per_tok"],
            "expert_ffn_dim": hf["moe_intermediate_size"], "n_shared_experts": hf.get("n_shared_experts") or 0,
            "score_func": "sigmoid", "norm_topk_prob": bool(hf.get("norm_topk_prob", True)),
            "routed_scaling_factor": hf.get("routed_scaling_factor", 1.0), "n_groups": hf.get("n_group") or 1,
            "topk_groups": hf.get("topk_group") or 1, "use_expert_bias": True, "router_dtype": "float32",
        }
        return {
            "vocab_size": hf["vocab_size"], "d_model": hf["hidden_size"], "n_layers": n,
            "n_heads": hf["num_attention_heads"], "ffn_dim": hf["intermediate_size"],
            "max_seq_len": hf["max_position_embeddings"], "norm_eps": hf["rms_norm_eps"],
            "tie_embeddings": bool(hf.get("tie_word_embeddings", False)), **rope_from_hf(hf),
            "attention": "mla", "q_lora_rank": hf.get("q_lora_rank"), "kv_lora_rank": hf["kv_lora_rank"],
            "qk_nope_head_dim": hf["qk_nope_head_dim"], "qk_rope_head_dim": hf["qk_rope_head_dim"],
            "v_head_dim": hf["v_head_dim"], "rope_interleave": bool(hf.get("rope_interleave", True)),
            "moe": moe, "dense_layers": list(range(min(first_dense, n))),
        }

    def config_to_hf(self, cfg) -> dict:
        if cfg.attention != "mla":
            raise HFConversionError("deepseek_v3 has multi-head latent attention; this model has attention='gqa'")
        if cfg.rope_scaling is not None and cfg.rope_scaling.type != "yarn":
            raise HFConversionError(
                f"deepseek_v3 exports support only yarn rope_scaling, not {cfg.rope_scaling.type!r}")
        self._require_moe(cfg, score_func="sigmoid", use_expert_bias=True, shared_expert_gate=False)
        k = len(cfg.dense_layers)
        if cfg.dense_layers != list(range(k)):
            raise HFConversionError(f"deepseek_v3 keeps dense layers first (0..k-1); dense_layers={cfg.dense_layers}")
        m = cfg.moe
        return {
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_heads, "max_position_embeddings": cfg.max_seq_len,
            "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu",
            **rope_to_hf(cfg), "attention_bias": False, "q_lora_rank": cfg.q_lora_rank,
            "kv_lora_rank": cfg.kv_lora_rank, "qk_nope_head_dim": cfg.qk_nope_head_dim,
            "qk_rope_head_dim": cfg.qk_rope_head_dim, "v_head_dim": cfg.v_head_dim,
            "rope_interleave": cfg.rope_interleave, "first_k_dense_replace": k,
            "n_routed_experts": m.n_experts, "num_experts_per_tok": m.top_k, "moe_intermediate_size": m.expert_ffn_dim,
            "n_shared_experts": m.n_shared_experts, "norm_topk_prob": m.norm_topk_prob,
            "routed_scaling_factor": m.routed_scaling_factor, "n_group": m.n_groups, "topk_group": m.topk_groups,
            "num_nextn_predict_layers": 0,
        }

    def default_for(self, cfg) -> bool:
        return cfg.attention == "mla"
