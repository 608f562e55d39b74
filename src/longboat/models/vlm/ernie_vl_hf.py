"""ERNIE-4.5-VL-MoE checkpoints (transformers' ``Ernie4_5_VLMoeForConditionalGeneration``) in and out for the composed
model: the ERNIE tower and resampler (``vision.arch: ernie4_5_vl_vision``, projector ``identity``), and a decoder whose
MoE layers route text tokens to the text experts and image tokens (with the image start and end tokens:
``vision_token_ids``) to the vision experts (``language.vision_moe``), with ERNIE's 3-D RoPE
(``language.mrope_alternating``).

Stored names: ``model.vision_model.*``, ``model.resampler_model.*``, the decoder under ``model.`` with ``lm_head``;
a MoE layer keeps its text experts as ``mlp.experts.{0..E-1}`` and its vision experts as ``mlp.experts.{E..2E-1}``,
the routers transposed as ``mlp.gate.weight`` (text) and ``mlp.gate.weight_1`` (vision), both selection biases in one
``mlp.moe_statics.e_score_correction_bias`` [2, E]. ERNIE rotates adjacent pairs of each q/k head; the rows are
permuted into rotate-half order on import and back on export (as for ``ernie4_5_moe``). What the model cannot
represent is refused by name: biases, unequal height and width rope sections, a layer type other than dense/sparse.
"""

from __future__ import annotations

import re

import torch

from longboat.models.llm.adapters.ernie4_5_moe import halves_to_pairs, pairs_to_halves
from longboat.models.llm.adapters.llama import DENSE_NAMES
from longboat.models.llm.hf.adapter import HFAdapter, HFConversionError, register_hf_adapter, reject
from longboat.models.moe import fuse_gate_up, split_gate_up
from longboat.models.vision import ernie4_5_vl
from longboat.models.vlm.qwen_vl_hf import LANGUAGE, VISION, preprocessor_from_dir, split_state

EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
ROUTER = re.compile(r"model\.layers\.(\d+)\.mlp\.(gate\.weight|gate\.weight_1|moe_statics\.e_score_correction_bias)")
SHARED = re.compile(r"model\.layers\.(\d+)\.mlp\.shared_experts\.(gate_proj|up_proj|down_proj)\.weight")
OURS_MOE = re.compile(r"layers\.(\d+)\.feed_forward\.(text|vision)\.(router\.weight|router\.expert_bias|experts\.w13|"
                      r"experts\.w2)")
SHARED_NAMES = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
QK = re.compile(r"model\.layers\.\d+\.self_attn\.[qk]_proj\.weight")
ROUTING = {"score_func": "softmax", "norm_topk_prob": True, "use_expert_bias": True, "router_dtype": "float32"}


@register_hf_adapter("ernie4_5_vl_moe")
class Ernie45VLMoeAdapter(HFAdapter):
    arch = "vlm"
    architecture = "Ernie4_5_VLMoeForConditionalGeneration"

    def config_from_hf(self, hf: dict) -> dict:
        text, vision = dict(hf["text_config"]), hf["vision_config"]
        reject(text, "use_bias", lambda v: not v, "the decoder's projections have no biases")
        reject(text, "hidden_act", lambda v: v == "silu", "the decoder's MLP is SwiGLU (silu)")
        rope = dict(text.get("rope_parameters") or {})
        if rope.get("rope_type", "default") != "default":
            raise HFConversionError(f"config.json text_config.rope_parameters.rope_type={rope['rope_type']!r} is not "
                                    "supported (default)")
        d, heads, n = text["hidden_size"], text["num_attention_heads"], text["num_hidden_layers"]
        head_dim = text.get("head_dim") or d // heads
        section = rope.get("mrope_section", [22, 22, 20])  # height, width, time
        if len(section) != 3 or section[0] != section[1] or sum(section) != head_dim // 2:
            raise HFConversionError(f"config.json mrope_section={section!r} is not supported: height and width "
                                    f"sections equal, the three summing to head_dim / 2 ({head_dim // 2})")
        types = text.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
        if set(types) - {"dense", "sparse"} or len(types) != n:
            raise HFConversionError(f"config.json mlp_layer_types={types!r} is not supported: one of dense/sparse "
                                    f"per layer ({n})")
        widths = text.get("moe_intermediate_size") or [1536, 512]
        if not isinstance(widths, list) or len(widths) != 2:
            raise HFConversionError(f"config.json moe_intermediate_size={widths!r} is not supported: [text, vision]")
        moe = {"d_model": d, "n_experts": text["moe_num_experts"], "top_k": text["moe_k"],
               "topk_norm_min": text.get("moe_norm_min", 1e-12), **ROUTING}
        language = {
            "vocab_size": text["vocab_size"], "d_model": d, "n_layers": n, "n_heads": heads,
            "n_kv_heads": text.get("num_key_value_heads") or heads, "ffn_dim": text["intermediate_size"],
            "max_seq_len": text["max_position_embeddings"], "norm_eps": text.get("rms_norm_eps", 1e-5),
            "tie_embeddings": bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings", True))),
            "rope_theta": rope.get("rope_theta", 500000.0), "mrope_section": (section[2], section[0], section[1]),
            "mrope_alternating": True, "dense_layers": [i for i, t in enumerate(types) if t == "dense"],
            "moe": {**moe, "expert_ffn_dim": widths[0], "n_shared_experts": text.get("moe_num_shared_experts", 0)},
            "vision_moe": {**moe, "expert_ffn_dim": widths[1]},
        }
        if head_dim != d // heads:
            language["head_dim"] = head_dim
        tower = ernie4_5_vl.config_from_hf(vision, text).model_dump()
        return {"vision": {"arch": "ernie4_5_vl_vision", **tower}, "projector": {"kind": "identity"},
                "language": language, "image_token_id": hf["image_token_id"],
                "vision_token_ids": (hf["image_start_token_id"], hf["image_end_token_id"])}

    def config_from_dir(self, hf: dict, hf_dir) -> dict:
        fields = self.config_from_hf(hf)
        fields["vision"].update(preprocessor_from_dir(hf_dir, {**fields["vision"], "temporal_patch_size": 1}))
        return fields

    def config_to_hf(self, cfg) -> dict:
        v, lang = cfg.vision, cfg.language
        if v.arch != "ernie4_5_vl_vision" or cfg.projector.kind != "identity":
            raise HFConversionError("an ernie4_5_vl_moe export needs vision.arch 'ernie4_5_vl_vision' with "
                                    "projector.kind 'identity'")
        if not lang.mrope_alternating or lang.moe is None or lang.vision_moe is None or len(cfg.vision_token_ids) != 2:
            raise HFConversionError("an ernie4_5_vl_moe export needs language.mrope_alternating, language.moe, "
                                    "language.vision_moe and vision_token_ids (image start, image end)")
        m, vm = lang.moe, lang.vision_moe
        for group, moe in (("moe", m), ("vision_moe", vm)):
            wrong = [f"{k}={getattr(moe, k)!r}" for k, want in ROUTING.items() if getattr(moe, k) != want]
            if wrong or moe.topk_norm_min is None or (moe.n_experts, moe.top_k) != (m.n_experts, m.top_k) \
                    or moe.n_groups != 1 or moe.routed_scaling_factor != 1.0 or moe.shared_expert_gate:
                raise HFConversionError(f"ernie4_5_vl_moe cannot represent language.{group} ({', '.join(wrong)}): "
                                        "softmax routing with a selection bias, weights renormalised with a "
                                        "topk_norm_min, both groups of the same size and top_k")
        if m.shared_ffn_dim not in (None, m.expert_ffn_dim) or lang.qkv_bias or lang.qk_norm:
            raise HFConversionError("ernie4_5_vl_moe has shared experts as wide as the text experts and no q/k "
                                    "biases or norms")
        t, h, w = lang.mrope_section
        text = {
            "vocab_size": lang.vocab_size, "hidden_size": lang.d_model, "intermediate_size": lang.ffn_dim,
            "num_hidden_layers": lang.n_layers, "num_attention_heads": lang.n_heads,
            "num_key_value_heads": lang.kv_heads, "head_dim": lang.head_size, "hidden_act": "silu",
            "max_position_embeddings": lang.max_seq_len, "rms_norm_eps": lang.norm_eps, "use_bias": False,
            "tie_word_embeddings": lang.tie_embeddings, "model_type": "ernie4_5_vl_moe_text",
            "rope_parameters": {"rope_type": "default", "rope_theta": lang.rope_theta, "mrope_section": [h, w, t]},
            "mlp_layer_types": ["dense" if i in lang.dense_layers else "sparse" for i in range(lang.n_layers)],
            "moe_intermediate_size": [m.expert_ffn_dim, vm.expert_ffn_dim], "moe_k": m.top_k,
            "moe_num_experts": m.n_experts, "moe_num_shared_experts": m.n_shared_experts,
            "moe_norm_min": m.topk_norm_min,
        }
        if v.out_norm_eps != lang.norm_eps:
            raise HFConversionError(f"vision.out_norm_eps ({v.out_norm_eps}) must be language.norm_eps "
                                    f"({lang.norm_eps}): the checkpoint keeps one")
        return {"text_config": text, "vision_config": {"model_type": "ernie4_5_vl_moe_vision",
                                                       **ernie4_5_vl.config_to_hf(v)},
                "image_token_id": cfg.image_token_id, "image_start_token_id": cfg.vision_token_ids[0],
                "image_end_token_id": cfg.vision_token_ids[1], "tie_word_embeddings": lang.tie_embeddings}

    def default_for(self, cfg) -> bool:
        return getattr(getattr(cfg, "vision", None), "arch", None) == "ernie4_5_vl_vision"

    def state_dict_from_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        lang = cfg.language
        n_text = lang.moe.n_experts
        out = {VISION + k: v for k, v in ernie4_5_vl.state_dict_from_hf(sd).items()}
        experts: dict[tuple[int, str], dict[str, dict[int, torch.Tensor]]] = {}
        for name, value in sd.items():
            if ernie4_5_vl.is_tower_tensor(name) or (name == "lm_head.weight" and lang.tie_embeddings):
                continue
            if m := EXPERT.fullmatch(name):
                layer, j, proj = int(m.group(1)), int(m.group(2)), m.group(3)
                group = "text" if j < n_text else "vision"
                experts.setdefault((layer, group), {}).setdefault(proj, {})[j % n_text] = value
            elif m := ROUTER.fullmatch(name):
                ours = f"{LANGUAGE}layers.{m.group(1)}.feed_forward."
                if m.group(2) == "moe_statics.e_score_correction_bias":
                    text, vision = (row.float().clone() for row in value)  # apart, not views of one tensor
                    out[ours + "text.router.expert_bias"], out[ours + "vision.router.expert_bias"] = text, vision
                else:  # stored [d, E]
                    out[ours + ("text" if m.group(2) == "gate.weight" else "vision") + ".router.weight"] = value.T
            elif m := SHARED.fullmatch(name):
                out[f"{LANGUAGE}layers.{m.group(1)}.feed_forward.shared_experts.{SHARED_NAMES[m.group(2)]}.weight"] = \
                    value
            elif (ours := DENSE_NAMES.from_hf(name)) is not None:
                out[LANGUAGE + ours] = pairs_to_halves(value, lang.head_size) if QK.fullmatch(name) else value
            else:
                raise HFConversionError(f"unexpected tensor {name!r} in an ernie4_5_vl_moe checkpoint")
        for (layer, group), projs in experts.items():
            prefix = f"{LANGUAGE}layers.{layer}.feed_forward.{group}.experts."
            stacked = {p: torch.stack([ws[j] for j in sorted(ws)]) for p, ws in projs.items()}
            if "gate_proj" in stacked and "up_proj" in stacked:
                out[prefix + "w13"] = fuse_gate_up(stacked["gate_proj"], stacked["up_proj"])
            if "down_proj" in stacked:
                out[prefix + "w2"] = stacked["down_proj"]
        return out

    def state_dict_to_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        vision, language, other = split_state(sd)
        if other:
            raise HFConversionError(f"tensor {other[0]!r} has no ernie4_5_vl_moe counterpart")
        lang, n_text = cfg.language, cfg.language.moe.n_experts
        out = ernie4_5_vl.state_dict_to_hf(vision)
        biases: dict[str, dict[str, torch.Tensor]] = {}
        for name, value in language.items():
            if m := OURS_MOE.fullmatch(name):
                layer, group, what = m.groups()
                prefix = f"model.layers.{layer}.mlp."
                if what == "router.weight":
                    out[prefix + ("gate.weight" if group == "text" else "gate.weight_1")] = value.T
                elif what == "router.expert_bias":
                    biases.setdefault(prefix, {})[group] = value
                else:
                    offset = 0 if group == "text" else n_text
                    projs = dict(zip(("gate_proj", "up_proj"), split_gate_up(value))) if what == "experts.w13" \
                        else {"down_proj": value}
                    for proj, weights in projs.items():
                        for j, w in enumerate(weights.unbind(0)):
                            out[f"{prefix}experts.{offset + j}.{proj}.weight"] = w
            elif ".feed_forward.shared_experts." in name:
                layer, rest = name.removeprefix("layers.").split(".feed_forward.shared_experts.")
                hf = {v: k for k, v in SHARED_NAMES.items()}[rest.removesuffix(".weight")]
                out[f"model.layers.{layer}.mlp.shared_experts.{hf}.weight"] = value
            elif (theirs := DENSE_NAMES.to_hf(name)) is not None:
                out[theirs] = halves_to_pairs(value, lang.head_size) if QK.fullmatch(theirs) else value
            else:
                raise HFConversionError(f"tensor {name!r} has no ernie4_5_vl_moe counterpart")
        for prefix, pair in biases.items():
            # One tensor holds both groups' biases; a lone one (asked for its stored name) pairs with itself.
            text = pair.get("text", pair.get("vision"))
            out[prefix + "moe_statics.e_score_correction_bias"] = torch.stack([text, pair.get("vision", text)])
        return out
