"""ERNIE-4.5 MoE checkpoints (Baidu): softmax top-k experts chosen with a score-correction bias, summed shared
experts, MoE layers from ``moe_layer_start_index`` to ``moe_layer_end_index`` every ``moe_layer_interval``.

ERNIE rotates adjacent pairs (2i, 2i+1) of each query/key head; the decoder rotates (i, i + head_dim/2). Permuting
the rows of q_proj and k_proj within each head turns one into the other exactly (attention scores are sums over
the head's dimensions, so the order does not matter), and the inverse permutation restores them on export.
"""

from __future__ import annotations

import torch

from longboat.models.llm.adapters.llama import DENSE_NAMES
from longboat.models.llm.adapters.mixtral import MoEAdapter, moe_names
from longboat.models.llm.hf.adapter import HFConversionError, NameMap, register_hf_adapter, reject

_BIAS = "layers.{i}.feed_forward.router.expert_bias"
ERNIE_MOE_NAMES = moe_names("mlp") + [
    # On disk the bias sits beside the router; transformers' module keeps it inside the gate. Exports write the former.
    ("model.layers.{i}.mlp.moe_statics.e_score_correction_bias", _BIAS),
    ("model.layers.{i}.mlp.gate.moe_statics.e_score_correction_bias", _BIAS),
    ("model.layers.{i}.mlp.shared_experts.gate_proj.weight", "layers.{i}.feed_forward.shared_experts.w1.weight"),
    ("model.layers.{i}.mlp.shared_experts.down_proj.weight", "layers.{i}.feed_forward.shared_experts.w2.weight"),
    ("model.layers.{i}.mlp.shared_experts.up_proj.weight", "layers.{i}.feed_forward.shared_experts.w3.weight"),
]


def pairs_to_halves(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """q/k projection rows of each head from ERNIE's pairwise rope order to rotate-half order (0, 2, ..., 1, 3, ...)."""
    return w.unflatten(0, (-1, head_dim // 2, 2)).transpose(1, 2).flatten(0, 2)


def halves_to_pairs(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The inverse of ``pairs_to_halves``."""
    return w.unflatten(0, (-1, 2, head_dim // 2)).transpose(1, 2).flatten(0, 2)


def moe_layer_span(moe_layers: list[int]) -> tuple[int, int, int] | None:
    """(start, end, interval) such that layer i has experts iff start <= i <= end and (i + 1) % interval == 0."""
    if not moe_layers:
        return None
    start, end = moe_layers[0], moe_layers[-1]
    for interval in range(1, end + 2):
        if [i for i in range(start, end + 1) if (i + 1) % interval == 0] == moe_layers:
            return start, end, interval
    return None


@register_hf_adapter("ernie4_5_moe")
class Ernie45MoeAdapter(MoEAdapter):
    architecture = "Ernie4_5_MoeForCausalLM"
    names = NameMap(DENSE_NAMES.pairs + ERNIE_MOE_NAMES)
    writes_head_dim = False  # ERNIE derives head_dim from hidden_size

    def config_from_hf(self, hf: dict) -> dict:
        reject(hf, "use_bias", lambda v: not v, "the decoder's projections have no biases")
        # transformers' defaults for keys an ERNIE config.json may leave out.
        hf = {"rope_theta": 500000.0, "tie_word_embeddings": True, **hf}
        n = hf["num_hidden_layers"]
        end = hf.get("moe_layer_end_index", -1)
        start, end = hf.get("moe_layer_start_index", 1), n - 1 if end == -1 else end
        interval = hf.get("moe_layer_interval", 1)
        dense = [i for i in range(n) if not (start <= i <= end and (i + 1) % interval == 0)]
        if len(dense) == n:
            raise HFConversionError(f"config.json moe_layer_start_index={start}, moe_layer_end_index={end}, "
                                    f"moe_layer_interval={interval} select no MoE layer of {n}: a dense model")
        moe = {
            "d_model": hf["hidden_size"], "n_experts": hf["moe_num_experts"], "top_k": hf["moe_k"],
            "expert_ffn_dim": hf["moe_intermediate_size"], "n_shared_experts": hf.get("moe_num_shared_experts") or 0,
            "score_func": "softmax", "norm_topk_prob": True, "topk_norm_min": hf.get("moe_norm_min", 1e-12),
            "use_expert_bias": True, "router_dtype": "float32",
        }
        return {**super().config_from_hf(hf), "moe": moe, "dense_layers": dense}

    def config_to_hf(self, cfg) -> dict:
        if cfg.attention != "gqa":
            raise HFConversionError("ernie4_5_moe has grouped-query attention; this model has attention='mla'")
        self._require(cfg, qkv_bias=False, qk_norm=False)
        self._require_moe(cfg, score_func="softmax", norm_topk_prob=True, n_groups=1, routed_scaling_factor=1.0,
                          use_expert_bias=True, shared_expert_gate=False, router_dtype="float32")
        m = cfg.moe
        if m.topk_norm_min is None:
            raise HFConversionError("ernie4_5_moe divides the chosen weights by max(sum, moe_norm_min); "
                                    "this model has moe.topk_norm_min=None (set it, e.g. 1e-12)")
        if m.shared_ffn_dim not in (None, m.expert_ffn_dim):
            raise HFConversionError(f"ernie4_5_moe shared experts are as wide as routed ones ({m.expert_ffn_dim}); "
                                    f"this model has moe.shared_ffn_dim={m.shared_ffn_dim}")
        span = moe_layer_span([i for i in range(cfg.n_layers) if i not in cfg.dense_layers])
        if span is None:
            raise HFConversionError(f"ernie4_5_moe puts experts in every interval-th layer of one span; "
                                    f"dense_layers={cfg.dense_layers} is not such a pattern")
        start, end, interval = span
        return super().config_to_hf(cfg) | {
            "use_bias": False, "moe_num_experts": m.n_experts, "moe_k": m.top_k,
            "moe_intermediate_size": m.expert_ffn_dim, "moe_num_shared_experts": m.n_shared_experts,
            "moe_layer_start_index": start, "moe_layer_end_index": end, "moe_layer_interval": interval,
            "moe_norm_min": m.topk_norm_min,
        }

    def state_dict_from_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        out = super().state_dict_from_hf(sd, cfg)
        for name, value in out.items():
            if name.endswith(("attention.wq.weight", "attention.wk.weight")):
                out[name] = pairs_to_halves(value, cfg.head_size)
            elif name.endswith("router.expert_bias"):
                out[name] = value.reshape(-1)  # stored [1, E]: one expert group
        return out

    def state_dict_to_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        out = super().state_dict_to_hf(sd, cfg)
        for name, value in out.items():
            if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
                out[name] = halves_to_pairs(value, cfg.head_size)
            elif name.endswith("e_score_correction_bias"):
                out[name] = value.reshape(1, -1)
        return out

    def default_for(self, cfg) -> bool:
        return (cfg.moe is not None and cfg.attention == "gqa" and cfg.moe.use_expert_bias
                and cfg.moe.score_func == "softmax" and not cfg.qk_norm and not cfg.qkv_bias)
