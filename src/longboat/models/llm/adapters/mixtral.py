"""Mixtral checkpoints (softmax top-k experts in every layer), and the expert stacking MoE families share.

Checkpoints store one tensor per expert (``experts.{j}.w1.weight``, or ``gate_proj``/``up_proj``/``down_proj``).
Ours are stacked per layer: ``w13`` [E, 2, ffn, d] holds gate and up, ``w2`` [E, d, ffn] the down projection.
transformers v5 modules fuse them into ``experts.gate_up_proj`` [E, 2·ffn, d] (gate rows first, then up rows: the
same memory as ``w13``) and ``experts.down_proj``; imports accept that layout too, exports write per-expert
tensors, which is what transformers reads and writes on disk.
"""

from __future__ import annotations

import re

import torch

from longboat.models.llm.adapters.llama import DENSE_NAMES, DenseAdapter
from longboat.models.llm.hf.adapter import HFConversionError, NameMap, register_hf_adapter
from longboat.models.moe import fuse_gate_up, split_gate_up

MIXTRAL_PROJ = {"gate": "w1", "down": "w2", "up": "w3"}  # Mixtral's per-expert tensor names


class MoEAdapter(DenseAdapter):
    """A dense adapter whose MoE layers keep their experts as per-expert tensors under ``{block}.experts.{j}``."""

    moe_block = "mlp"  # HF module holding router and experts
    expert_proj = {"gate": "gate_proj", "down": "down_proj", "up": "up_proj"}  # projection -> HF per-expert name

    def state_dict_from_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        block = re.escape(self.moe_block)
        per_expert = re.compile(rf"model\.layers\.(\d+)\.{block}\.experts\.(\d+)\.(\w+)\.weight")
        fused = re.compile(rf"model\.layers\.(\d+)\.{block}\.experts\.(gate_up_proj|down_proj)")
        to_proj = {hf: proj for proj, hf in self.expert_proj.items()}
        parts: dict[int, dict[str, dict[int, torch.Tensor]]] = {}
        stacked: dict[int, dict[str, torch.Tensor]] = {}
        rest = {}
        for name, value in sd.items():
            if (m := per_expert.fullmatch(name)) and m.group(3) in to_proj:
                parts.setdefault(int(m.group(1)), {}).setdefault(to_proj[m.group(3)], {})[int(m.group(2))] = value
            elif m := fused.fullmatch(name):
                layer = stacked.setdefault(int(m.group(1)), {})
                if m.group(2) == "down_proj":
                    layer["down"] = value
                else:
                    layer["gate"], layer["up"] = value.unflatten(1, (2, -1)).unbind(1)
            else:
                rest[name] = value
        for layer, projs in parts.items():
            for proj, experts in projs.items():
                if sorted(experts) != list(range(len(experts))):
                    raise HFConversionError(f"layer {layer}: experts {sorted(experts)} of {proj} are not 0..n-1")
                stacked.setdefault(layer, {})[proj] = torch.stack([experts[j] for j in sorted(experts)])
        out = {}
        for layer, projs in stacked.items():
            # A streamed import converts w13 and w2 apart, each once its own parts are read; the whole-checkpoint
            # check (check_hf_tensors) has already named any projection missing from the files.
            if ("gate" in projs) != ("up" in projs):
                raise HFConversionError(f"layer {layer}: the experts have {sorted(projs)} projections; gate and up "
                                        "make one fused weight and come together")
            prefix = f"layers.{layer}.feed_forward.experts"
            if "gate" in projs:
                out[f"{prefix}.w13"] = fuse_gate_up(projs["gate"], projs["up"])
            if "down" in projs:
                out[f"{prefix}.w2"] = projs["down"]
        return out | super().state_dict_from_hf(rest, cfg)

    def state_dict_to_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        stacked = re.compile(r"layers\.(\d+)\.feed_forward\.experts\.(w13|w2)")
        rest, out = {}, {}
        for name, value in sd.items():
            if m := stacked.fullmatch(name):
                prefix = f"model.layers.{m.group(1)}.{self.moe_block}.experts"
                projs = dict(zip(("gate", "up"), split_gate_up(value))) if m.group(2) == "w13" else {"down": value}
                for proj, weights in projs.items():
                    for j, w in enumerate(weights.unbind(0)):
                        out[f"{prefix}.{j}.{self.expert_proj[proj]}.weight"] = w
            else:
                rest[name] = value
        return out | super().state_dict_to_hf(rest, cfg)

    def _require_moe(self, cfg, **expected) -> None:
        """Fail when ``cfg`` has no MoE or its routing differs from what the family computes."""
        if cfg.moe is None:
            raise HFConversionError(f"{self.model_type} is a mixture-of-experts family; this model has no moe")
        wrong = [f"{k}={getattr(cfg.moe, k)!r} (needs {v!r})" for k, v in expected.items() if getattr(cfg.moe, k) != v]
        if wrong:
            raise HFConversionError(f"{self.model_type} cannot represent moe.{', moe.'.join(wrong)}")


def moe_names(block: str, shared: bool = False) -> list[tuple[str, str]]:
    """Router (and shared expert) names of an MoE layer whose HF module is ``model.layers.{i}.<block>``."""
    hf, ours = f"model.layers.{{i}}.{block}", "layers.{i}.feed_forward"
    pairs = [(f"{hf}.gate.weight", f"{ours}.router.weight")]
    if shared:
        pairs += [
            (f"{hf}.gate.e_score_correction_bias", f"{ours}.router.expert_bias"),
            (f"{hf}.shared_experts.gate_proj.weight", f"{ours}.shared_experts.w1.weight"),
            (f"{hf}.shared_experts.down_proj.weight", f"{ours}.shared_experts.w2.weight"),
            (f"{hf}.shared_experts.up_proj.weight", f"{ours}.shared_experts.w3.weight"),
        ]
    return pairs


@register_hf_adapter("mixtral")
class MixtralAdapter(MoEAdapter):
    architecture = "MixtralForCausalLM"
    moe_block = "block_sparse_moe"
    expert_proj = MIXTRAL_PROJ
    names = NameMap(DENSE_NAMES.pairs + moe_names("block_sparse_moe"))

    def config_from_hf(self, hf: dict) -> dict:
        out = super().config_from_hf(hf)
        # As for Mistral: the decoder attends to the whole prefix, so cap max_seq_len at the window.
        window = hf.get("sliding_window")
        if window is not None and window < out["max_seq_len"]:
            out["max_seq_len"] = window
        out["moe"] = {
            "d_model": hf["hidden_size"], "n_experts": hf["num_local_experts"], "top_k": hf["num_experts_per_tok"],
            "expert_ffn_dim": hf["intermediate_size"], "score_func": "softmax", "norm_topk_prob": True,
            "router_dtype": "input",
        }
        return out

    def config_to_hf(self, cfg) -> dict:
        if cfg.attention != "gqa":
            raise HFConversionError("mixtral has grouped-query attention; this model has attention='mla'")
        self._require(cfg, qkv_bias=False, qk_norm=False)
        self._require_moe(cfg, score_func="softmax", norm_topk_prob=True, n_shared_experts=0, n_groups=1,
                          routed_scaling_factor=1.0, use_expert_bias=False)
        if cfg.dense_layers:
            raise HFConversionError(f"mixtral has experts in every layer; dense_layers={cfg.dense_layers}")
        out = super().config_to_hf(cfg)
        return out | {"intermediate_size": cfg.moe.expert_ffn_dim, "num_local_experts": cfg.moe.n_experts,
                      "num_experts_per_tok": cfg.moe.top_k, "sliding_window": None}

    def default_for(self, cfg) -> bool:
        return cfg.moe is not None and cfg.attention == "gqa" and not cfg.qk_norm and not cfg.qkv_bias
