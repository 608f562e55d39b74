"""SmolVLM checkpoints (transformers' ``SmolVLMForConditionalGeneration``) in and out for the composed model, and
Idefics3's (``Idefics3ForConditionalGeneration``), which have the same layout: SigLIP's vision transformer with its
post-layernorm (``vision.arch: siglip``), the pixel-shuffle connector (``projector.kind: pixel_shuffle``,
``merge_size`` = ``scale_factor``, one linear layer without bias) and a decoder family the decoder's adapters read
(SmolLM2 is a Llama).

Images enter at the tower's full square size, one image per placeholder run of ``(grid / scale_factor)²`` tokens;
SmolVLM's splitting of an image into tiles with row/column marker tokens is the processor's business and the model
is the same. The top-level ``tie_word_embeddings`` is the one transformers ties the head by.
"""

from __future__ import annotations

import re

import torch

from longboat.models.llm.hf.adapter import (
    HFAdapter,
    HFConversionError,
    get_hf_adapter,
    infer_family,
    register_hf_adapter,
    reject,
)
from longboat.models.vision.siglip import siglip_from_hf, siglip_to_hf

VISION_PREFIX, TEXT_PREFIX = "model.vision_model.", "model.text_model."
CONNECTOR = "model.connector.modality_projection.proj.weight"
# What transformers' vision config assumes for a key config.json leaves out (older saves write only the changed ones).
VISION_DEFAULTS = {"hidden_size": 1152, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 16,
                   "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "gelu_pytorch_tanh",
                   "layer_norm_eps": 1e-6}


def _text_adapter(family: str) -> HFAdapter:
    adapter = get_hf_adapter(family)
    if adapter.arch != "decoder":
        raise HFConversionError(f"text_config.model_type {family!r} is not a decoder language model")
    return adapter


def _square(vision: dict, key: str) -> int:
    value = vision[key]
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise HFConversionError(f"config.json vision_config.{key}={value!r} is not supported: the tower is square")
        value = value[0]
    return int(value)


@register_hf_adapter("smolvlm")
class SmolVLMAdapter(HFAdapter):
    arch = "vlm"
    architecture = "SmolVLMForConditionalGeneration"
    vision_model_type = "smolvlm_vision"

    def config_from_hf(self, hf: dict) -> dict:
        vision, text = {**VISION_DEFAULTS, **hf.get("vision_config", {})}, hf["text_config"]
        reject(vision, "hidden_act", lambda v: v == "gelu_pytorch_tanh", "the tower's MLP is a tanh GELU")
        reject(vision, "num_channels", lambda v: v == 3, "the tower reads RGB")
        d = vision["hidden_size"]
        size = vision.get("size")  # older saves carry the processor's first resize here
        longest_edge = size.get("longest_edge") if isinstance(size, dict) else None
        language = _text_adapter(text.get("model_type", "llama")).config_from_hf(text)
        language["tie_embeddings"] = bool(hf.get("tie_word_embeddings", False))
        return {
            "vision": {"arch": "siglip", "image_size": _square(vision, "image_size"),
                       "patch_size": _square(vision, "patch_size"), "d_model": d,
                       "n_layers": vision["num_hidden_layers"], "n_heads": vision["num_attention_heads"],
                       "mlp_ratio": vision["intermediate_size"] / d, "norm_eps": vision["layer_norm_eps"],
                       "final_norm": True, "longest_edge": longest_edge},
            "projector": {"kind": "pixel_shuffle", "merge_size": hf.get("scale_factor", 2)},
            "language": language,
            "image_token_id": hf.get("image_token_id", 128257),
        }

    def config_to_hf(self, cfg) -> dict:
        _check_exportable(cfg, self.model_type)
        v = cfg.vision
        family = infer_family(cfg.language)
        return {
            "vision_config": {"model_type": self.vision_model_type, "hidden_size": v.d_model,
                              "intermediate_size": int(v.d_model * v.mlp_ratio), "num_hidden_layers": v.n_layers,
                              "num_attention_heads": v.n_heads, "num_channels": 3, "image_size": v.image_size,
                              "patch_size": v.patch_size, "hidden_act": "gelu_pytorch_tanh",
                              "layer_norm_eps": v.norm_eps},
            "text_config": {"model_type": family, **_text_adapter(family).config_to_hf(cfg.language)},
            "image_token_id": cfg.image_token_id, "scale_factor": cfg.projector.merge_size,
            "tie_word_embeddings": cfg.language.tie_embeddings,
        }

    def default_for(self, cfg) -> bool:
        projector = getattr(cfg, "projector", None)
        return getattr(projector, "kind", None) == "pixel_shuffle"

    def state_dict_from_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        text = _text_adapter(infer_family(cfg.language))
        out, vision, language = {}, {}, {}
        for name, value in sd.items():
            if any(re.fullmatch(p, name) for p in self.ignored_hf_tensors):
                continue
            if name.startswith(VISION_PREFIX):
                vision[name.removeprefix(VISION_PREFIX)] = value
            elif name.startswith(TEXT_PREFIX):  # the decoder's checkpoint names, under model.text_model
                language["model." + name.removeprefix(TEXT_PREFIX)] = value
            elif name == "lm_head.weight":
                language[name] = value
            elif name == CONNECTOR:
                out["projector.proj.weight"] = value
            else:
                raise HFConversionError(f"unexpected tensor {name!r} in a {self.model_type} checkpoint")
        try:
            out.update({f"vision.{k}": v for k, v in siglip_from_hf(vision).items()})
        except KeyError as e:
            raise HFConversionError(f"unexpected or incomplete tensor {VISION_PREFIX}{e.args[0]} in a "
                                    f"{self.model_type} checkpoint") from None
        out.update({f"language.{k}": v for k, v in text.state_dict_from_hf(language, cfg.language).items()})
        return out

    def state_dict_to_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        _check_exportable(cfg, self.model_type)
        text = _text_adapter(infer_family(cfg.language))
        out, vision, language = {}, {}, {}
        for name, value in sd.items():
            if name.startswith("language."):
                language[name.removeprefix("language.")] = value
            elif name.startswith("vision."):
                vision[name.removeprefix("vision.")] = value
            elif name == "projector.proj.weight":
                out[CONNECTOR] = value
            else:
                raise HFConversionError(f"tensor {name!r} has no {self.model_type} counterpart")
        try:
            out.update({VISION_PREFIX + k: v for k, v in siglip_to_hf(vision).items()})
        except KeyError as e:
            raise HFConversionError(f"tensor 'vision.{e.args[0]}' has no {self.model_type} counterpart") from None
        for name, value in text.state_dict_to_hf(language, cfg.language).items():
            out[(TEXT_PREFIX + name.removeprefix("model.")) if name.startswith("model.") else name] = value
        return out


@register_hf_adapter("idefics3")
class Idefics3Adapter(SmolVLMAdapter):
    """Idefics3: SmolVLM's architecture and tensor names under its own model types."""

    architecture = "Idefics3ForConditionalGeneration"
    vision_model_type = "idefics3_vision"

    def default_for(self, cfg) -> bool:
        return False


def _check_exportable(cfg, family: str) -> None:
    """What a SmolVLM checkpoint can hold of ``cfg``, or an error naming the field."""
    v, p = cfg.vision, cfg.projector
    if v.arch != "siglip" or not v.final_norm:
        raise HFConversionError(f"a {family} export needs vision.arch 'siglip' with vision.final_norm true")
    if int(v.d_model * v.mlp_ratio) != v.d_model * v.mlp_ratio:
        raise HFConversionError(f"vision.d_model × vision.mlp_ratio ({v.d_model * v.mlp_ratio}) must be whole")
    if p.kind != "pixel_shuffle":
        raise HFConversionError(f"a {family} export needs projector.kind 'pixel_shuffle', not {p.kind!r}")
