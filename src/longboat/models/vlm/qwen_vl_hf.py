"""Qwen2.5-VL and Qwen3-VL (dense and MoE) checkpoints (transformers' ``Qwen2_5_VLForConditionalGeneration``,
``Qwen3VLForConditionalGeneration``, ``Qwen3VLMoeForConditionalGeneration``) in and out for the composed model: the
family's vision tower with its own patch merger (projector ``identity``; Qwen3-VL's DeepStack features included), and
the Qwen2 / Qwen3 / Qwen3-MoE decoder with multimodal RoPE (``language.mrope_section``; interleaved for Qwen3-VL).

Qwen2.5-VL's config.json comes in two layouts: transformers 5's, with the decoder's fields under ``text_config`` and
``rope_parameters.mrope_section``, and the older flat one, with the decoder's fields at the top and
``rope_scaling: {type: mrope, mrope_section}``; both import, exports write the first. Tensors keep the checkpoints'
names (Qwen2.5-VL: ``model.layers.*``, ``visual.*``; Qwen3-VL: ``model.language_model.*``, ``model.visual.*``; both
``lm_head.weight``). ``preprocessor_config.json``, when the directory has one, gives the tower's pixel bounds and
normalisation. What the model cannot represent is refused by name:
sliding-window layers, a rope type other than multimodal RoPE, an ``mrope_section`` that does not cover head_dim / 2,
a merger whose width is not the decoder's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from longboat.models.llm.hf.adapter import HFAdapter, HFConversionError, get_hf_adapter, register_hf_adapter
from longboat.models.llm.hf.stream import read_json
from longboat.models.vision import qwen2_5_vl, qwen3_vl
from longboat.models.vlm.hf import PREPROCESSOR

LANGUAGE, VISION = "language.", "vision."


def text_fields(hf: dict) -> tuple[dict, dict]:
    """(the decoder's config.json fields, its rope parameters) from either layout."""
    text = dict(hf.get("text_config") or hf)
    for key in ("tie_word_embeddings",):  # transformers 5 keeps it at the top
        if key in hf:
            text[key] = hf[key]
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope.setdefault("rope_theta", text.get("rope_theta", 1000000.0))
    return text, rope


def mrope_from_hf(rope: dict, head_dim: int, interleaved_ok: bool = False) -> dict:
    """``mrope_section`` (and ``mrope_interleaved``) from a checkpoint's rope parameters, checked."""
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in ("default", "mrope"):
        raise HFConversionError(f"config.json rope_type {kind!r} is not supported: the decoder has multimodal RoPE "
                                "without frequency scaling (rope_type default)")
    section = rope.get("mrope_section")
    if not isinstance(section, (list, tuple)) or len(section) != 3 or sum(section) != head_dim // 2:
        raise HFConversionError(f"config.json mrope_section={section!r} is not supported: it must be three sizes "
                                f"summing to head_dim / 2 ({head_dim // 2})")
    out = {"mrope_section": tuple(section)}
    if rope.get("mrope_interleaved"):
        if not interleaved_ok:
            raise HFConversionError("config.json mrope_interleaved=true is not supported by this family")
        out["mrope_interleaved"] = True
    extra = sorted(set(rope) - {"rope_type", "type", "rope_theta", "mrope_section", "mrope_interleaved"})
    if extra:
        raise HFConversionError(f"config.json rope parameters {extra} are not supported")
    return out


def decoder_from_hf(text: dict, rope: dict, family: str, interleaved_ok: bool = False) -> dict:
    """The decoder's fields through the text family's adapter, with multimodal RoPE."""
    plain = {k: v for k, v in text.items() if k not in ("rope_scaling", "rope_parameters")}
    plain["rope_parameters"] = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
    fields = get_hf_adapter(family).config_from_hf(plain)
    head_dim = fields.get("head_dim") or fields["d_model"] // fields["n_heads"]
    return {**fields, **mrope_from_hf(rope, head_dim, interleaved_ok)}


def preprocessor_from_dir(hf_dir, vision: dict) -> dict:
    """The tower's image settings from ``preprocessor_config.json`` (none when the directory has none)."""
    path = Path(hf_dir) / PREPROCESSOR
    if not path.is_file():
        return {}
    pre = read_json(path)
    for key, ours in (("patch_size", "patch_size"), ("merge_size", "merge_size"),
                      ("temporal_patch_size", "temporal_patch_size")):
        if key in pre and pre[key] != vision[ours]:
            raise HFConversionError(f"{path}: {key}={pre[key]!r} differs from the tower's {vision[ours]}")
    for key, allowed in (("do_rescale", True), ("do_normalize", True), ("do_resize", True), ("resample", 3)):
        if key in pre and pre[key] != allowed:
            raise HFConversionError(f"{path}: {key}={pre[key]!r} is not supported (expected {allowed!r})")
    if "rescale_factor" in pre and abs(pre["rescale_factor"] - 1 / 255) > 1e-12:
        raise HFConversionError(f"{path}: rescale_factor={pre['rescale_factor']!r} is not supported (1/255)")
    size = pre.get("size") or {}
    out = {"min_pixels": pre.get("min_pixels", size.get("shortest_edge")),
           "max_pixels": pre.get("max_pixels", size.get("longest_edge")),
           "image_mean": pre.get("image_mean"), "image_std": pre.get("image_std")}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in out.items() if v is not None}


def split_state(sd: dict[str, torch.Tensor]) -> tuple[dict, dict, list[str]]:
    """(the tower's tensors, the decoder's tensors, names of neither) of one of our state dicts."""
    vision, language, other = {}, {}, []
    for name, value in sd.items():
        if name.startswith(VISION):
            vision[name.removeprefix(VISION)] = value
        elif name.startswith(LANGUAGE):
            language[name.removeprefix(LANGUAGE)] = value
        else:
            other.append(name)
    return vision, language, other


@register_hf_adapter("qwen2_5_vl")
class Qwen2_5_VLAdapter(HFAdapter):
    arch = "vlm"
    architecture = "Qwen2_5_VLForConditionalGeneration"
    text_family = "qwen2"
    text_prefix = "model."  # before the decoder's tensors in the checkpoint (the text family's own names: model.)
    tower_arch = "qwen2_5_vl_vision"
    tower = qwen2_5_vl
    interleaved = False  # Qwen3-VL takes each frequency from row i mod 3
    experts = False  # the decoder a family's exports default for: with experts or dense

    def config_from_hf(self, hf: dict) -> dict:
        text, rope = text_fields(hf)
        if self.interleaved:  # the family always interleaves, whatever the flag says
            rope["mrope_interleaved"] = True
        language = decoder_from_hf(text, rope, self.text_family, interleaved_ok=self.interleaved)
        vision = hf["vision_config"]
        width = vision.get("out_hidden_size", language["d_model"])
        if width != language["d_model"]:
            raise HFConversionError(f"config.json vision_config.out_hidden_size={width} is not supported: the merger "
                                    f"must output the decoder's hidden_size ({language['d_model']})")
        fields = self.tower.config_from_hf(vision, language["d_model"]).model_dump()
        return {"vision": {"arch": self.tower_arch, **fields}, "projector": {"kind": "identity"},
                "language": language, "image_token_id": hf["image_token_id"]}

    def config_from_dir(self, hf: dict, hf_dir) -> dict:
        fields = self.config_from_hf(hf)
        fields["vision"].update(preprocessor_from_dir(hf_dir, fields["vision"]))
        return fields

    def config_to_hf(self, cfg) -> dict:
        self._check_exportable(cfg)
        text = get_hf_adapter(self.text_family).config_to_hf(cfg.language)
        rope = {**text.pop("rope_parameters"), "mrope_section": list(cfg.language.mrope_section)}
        if self.interleaved:
            rope["mrope_interleaved"] = True
        return {
            "text_config": {**text, "model_type": f"{self.model_type}_text", "rope_parameters": rope},
            "vision_config": {"model_type": f"{self.model_type}_vision", **self.tower.config_to_hf(cfg.vision)},
            "image_token_id": cfg.image_token_id, "tie_word_embeddings": cfg.language.tie_embeddings,
        }

    def preprocessor_to_hf(self, cfg) -> dict:
        """``preprocessor_config.json`` for the tower's images (what transformers' image processor reads)."""
        v = cfg.vision
        return {"image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "resample": 3,
                "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
                "image_mean": list(v.image_mean), "image_std": list(v.image_std), "min_pixels": v.min_pixels,
                "max_pixels": v.max_pixels, "size": {"shortest_edge": v.min_pixels, "longest_edge": v.max_pixels},
                "patch_size": v.patch_size, "temporal_patch_size": v.temporal_patch_size, "merge_size": v.merge_size}

    def _check_exportable(self, cfg) -> None:
        v, lang = cfg.vision, cfg.language
        if v.arch != self.tower_arch or cfg.projector.kind != "identity":
            raise HFConversionError(f"a {self.model_type} export needs vision.arch {self.tower_arch!r} with "
                                    "projector.kind 'identity' (the tower's merger is the projector)")
        if lang.mrope_section is None or lang.mrope_interleaved != self.interleaved:
            raise HFConversionError(f"a {self.model_type} export needs language.mrope_section with "
                                    f"mrope_interleaved {str(self.interleaved).lower()}")
        if (lang.moe is not None) != self.experts:
            raise HFConversionError(f"a {self.model_type} export needs a language model "
                                    f"{'with' if self.experts else 'without'} experts (language.moe)")

    def default_for(self, cfg) -> bool:
        language = getattr(cfg, "language", None)
        return getattr(getattr(cfg, "vision", None), "arch", None) == self.tower_arch and \
            (getattr(language, "moe", None) is not None) == self.experts

    def state_dict_from_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        vision = {k: v for k, v in sd.items() if k.startswith(self.tower.HF_PREFIX)}
        language = {"model." + k.removeprefix(self.text_prefix) if k.startswith(self.text_prefix) else k: v
                    for k, v in sd.items() if k not in vision}
        out = {VISION + k: v for k, v in self.tower.state_dict_from_hf(vision).items()}
        text = get_hf_adapter(self.text_family).state_dict_from_hf(language, cfg.language)
        out.update({LANGUAGE + k: v for k, v in text.items()})
        return out

    def state_dict_to_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        vision, language, other = split_state(sd)
        if other:
            raise HFConversionError(f"tensor {other[0]!r} has no {self.model_type} counterpart")
        out = self.tower.state_dict_to_hf(vision, cfg.vision)
        for k, v in get_hf_adapter(self.text_family).state_dict_to_hf(language, cfg.language).items():
            out[self.text_prefix + k.removeprefix("model.") if k.startswith("model.") else k] = v
        return out


@register_hf_adapter("qwen3_vl")
class Qwen3VLAdapter(Qwen2_5_VLAdapter):
    """Qwen3-VL (dense): the Qwen3 decoder with interleaved multimodal RoPE, the Qwen3-VL tower with DeepStack;
    tensors under ``model.language_model.`` and ``model.visual.``."""

    architecture = "Qwen3VLForConditionalGeneration"
    text_family = "qwen3"
    text_prefix = "model.language_model."
    tower_arch = "qwen3_vl_vision"
    tower = qwen3_vl
    interleaved = True


@register_hf_adapter("qwen3_vl_moe")
class Qwen3VLMoeAdapter(Qwen3VLAdapter):
    """Qwen3-VL MoE: Qwen3-VL with the Qwen3-MoE decoder (softmax top-k experts, their weights always renormalised).
    Each layer's experts are fused: ``mlp.experts.gate_up_proj`` and ``mlp.experts.down_proj``. The published
    checkpoints store them transposed ([E, d, 2·ffn] with gate columns first, [E, ffn, d]); transformers 5 writes
    its modules' layout ([E, 2·ffn, d], [E, d, ffn]). Imports read either (by shape, as transformers does: a square
    tensor is taken as the modules' layout); exports write the modules' layout."""

    architecture = "Qwen3VLMoeForConditionalGeneration"
    text_family = "qwen3_moe"
    experts = True
    fused = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")

    def config_from_hf(self, hf: dict) -> dict:
        text = hf.get("text_config") or hf
        if "norm_topk_prob" in text and not text["norm_topk_prob"]:
            raise HFConversionError("config.json norm_topk_prob=false is not supported: qwen3_vl_moe always "
                                    "renormalises the top-k expert weights")
        fields = super().config_from_hf(hf)
        fields["language"]["moe"]["norm_topk_prob"] = True  # the family's router always renormalises
        return fields

    def config_to_hf(self, cfg) -> dict:
        if cfg.language.moe is None or not cfg.language.moe.norm_topk_prob:
            raise HFConversionError("a qwen3_vl_moe export needs language.moe with norm_topk_prob true (the "
                                    "family always renormalises the top-k expert weights)")
        out = super().config_to_hf(cfg)
        out["text_config"].pop("norm_topk_prob", None)
        return out

    def shape_matches(self, name: str, got: tuple[int, ...], expected: tuple[int, ...]) -> bool:
        transposed = name.endswith(self.fused) and got == (expected[0], expected[2], expected[1])
        return got == expected or transposed

    def state_dict_from_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        d, ffn = cfg.language.d_model, cfg.language.moe.expert_ffn_dim
        modules = {self.fused[0]: (2 * ffn, d), self.fused[1]: (d, ffn)}  # each one's [1:] in the modules' layout

        def layout(name: str, value: torch.Tensor) -> torch.Tensor:
            want = next((shape for end, shape in modules.items() if name.endswith(end)), None)
            return value if want is None or tuple(value.shape[1:]) == want else value.transpose(1, 2)

        return super().state_dict_from_hf({k: layout(k, v) for k, v in sd.items()}, cfg)

    def state_dict_to_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        experts = {k: v for k, v in sd.items() if k.endswith((".feed_forward.experts.w13", ".feed_forward.experts.w2"))}
        out = super().state_dict_to_hf({k: v for k, v in sd.items() if k not in experts}, cfg)
        for name, value in experts.items():
            layer = name.removeprefix(LANGUAGE + "layers.").split(".")[0]
            prefix = f"{self.text_prefix}layers.{layer}.mlp.experts."
            if name.endswith(".w13"):  # [E, 2, ffn, d]: gate rows, then up rows
                out[prefix + "gate_up_proj"] = value.flatten(1, 2)
            else:
                out[prefix + "down_proj"] = value
        return out
