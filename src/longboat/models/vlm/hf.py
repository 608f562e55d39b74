"""LLaVA checkpoints (transformers' ``LlavaForConditionalGeneration``) in and out for the composed model: a SigLIP
vision tower read at its last block (``vision_feature_layer: -1``, every patch: ``full``), LLaVA's two-layer GELU
projector, and any decoder family the decoder's adapters read as the language model.

Our ViT is SigLIP's vision transformer when it has no final norm (``vision.final_norm: false``): LLaVA reads the
tower's hidden states before SigLIP's ``post_layernorm``, so that norm (and the pooling head) are left out on import
and not written on export. A checkpoint LLaVA reads differently (another layer, the CLS-dropping ``default``
strategy, a CLIP tower) is refused by name.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from longboat.models.llm.hf.adapter import (
    HFAdapter,
    HFConversionError,
    NameMap,
    get_hf_adapter,
    infer_family,
    register_hf_adapter,
    reject,
)
from longboat.models.llm.hf_interop import DecoderHF

LANGUAGE_PREFIX = "language_model."  # before a decoder checkpoint's names, as transformers 5 saves LLaVA
VISION = NameMap([
    ("vision_tower.embeddings.patch_embedding.{p}", "vision.patch_embed.{p}"),
    ("vision_tower.embeddings.position_embedding.weight", "vision.pos_embed"),
    ("vision_tower.encoder.layers.{i}.layer_norm1.{p}", "vision.blocks.{i}.norm1.{p}"),
    ("vision_tower.encoder.layers.{i}.layer_norm2.{p}", "vision.blocks.{i}.norm2.{p}"),
    ("vision_tower.encoder.layers.{i}.self_attn.out_proj.{p}", "vision.blocks.{i}.attn.proj.{p}"),
    ("vision_tower.encoder.layers.{i}.mlp.fc1.{p}", "vision.blocks.{i}.mlp.0.{p}"),
    ("vision_tower.encoder.layers.{i}.mlp.fc2.{p}", "vision.blocks.{i}.mlp.2.{p}"),
    ("multi_modal_projector.linear_1.{p}", "projector.fc1.{p}"),
    ("multi_modal_projector.linear_2.{p}", "projector.fc2.{p}"),
])
QKV = "vision_tower.encoder.layers.{i}.self_attn.{which}_proj.{p}"
QKV_PART = re.compile(r"vision_tower\.encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)")


def _text_adapter(family: str) -> HFAdapter:
    adapter = get_hf_adapter(family)
    if adapter.arch != "decoder":
        raise HFConversionError(f"text_config.model_type {family!r} is not a decoder language model")
    return adapter


@register_hf_adapter("llava")
class LlavaAdapter(HFAdapter):
    arch = "vlm"
    architecture = "LlavaForConditionalGeneration"
    ignored_hf_tensors = (r"vision_tower\.(post_layernorm|head)\..*",
                          r".*\.rotary_emb\.inv_freq")

    def config_from_hf(self, hf: dict) -> dict:
        vision, text = hf["vision_config"], hf["text_config"]
        reject(vision, "model_type", lambda v: v == "siglip_vision_model",
               "the tower reads as our ViT only as SigLIP's vision transformer")
        reject(hf, "vision_feature_layer", lambda v: v == -1, "the tower's features are its last block's")
        reject(hf, "vision_feature_select_strategy", lambda v: v == "full", "every patch is an image token")
        reject(hf, "projector_hidden_act", lambda v: v == "gelu", "the projector is linear, GELU, linear")
        reject(hf, "multimodal_projector_bias", bool, "the projector's linear layers have biases")
        reject(vision, "hidden_act", lambda v: v == "gelu_pytorch_tanh", "the ViT's MLP is a tanh GELU")
        if vision.get("num_channels", 3) != 3:
            raise HFConversionError(f"vision_config.num_channels={vision['num_channels']}: the tower reads RGB")
        d, heads = vision["hidden_size"], vision["num_attention_heads"]
        return {
            "vision": {"arch": "vit", "image_size": vision["image_size"], "patch_size": vision["patch_size"],
                       "d_model": d, "n_layers": vision["num_hidden_layers"], "n_heads": heads,
                       "mlp_ratio": vision["intermediate_size"] / d, "norm_eps": vision.get("layer_norm_eps", 1e-6),
                       "final_norm": False},
            "projector": {"kind": "mlp"},
            "language": _text_adapter(text.get("model_type")).config_from_hf(text),
            "image_token_id": hf.get("image_token_index", hf.get("image_token_id")),
        }

    def config_to_hf(self, cfg) -> dict:
        _check_exportable(cfg)
        v = cfg.vision
        family = infer_family(cfg.language)
        return {
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": v.d_model,
                              "intermediate_size": int(v.d_model * v.mlp_ratio), "num_hidden_layers": v.n_layers,
                              "num_attention_heads": v.n_heads, "num_channels": 3, "image_size": v.image_size,
                              "patch_size": v.patch_size, "hidden_act": "gelu_pytorch_tanh",
                              "layer_norm_eps": v.norm_eps, "vision_use_head": False},
            "text_config": {"model_type": family, **_text_adapter(family).config_to_hf(cfg.language)},
            "image_token_index": cfg.image_token_id, "image_seq_length": v.grid**2,
            "vision_feature_layer": -1, "vision_feature_select_strategy": "full", "projector_hidden_act": "gelu",
            "multimodal_projector_bias": True, "tie_word_embeddings": cfg.language.tie_embeddings,
        }

    def default_for(self, cfg) -> bool:
        return hasattr(cfg, "vision") and hasattr(cfg, "language") and cfg.projector.kind != "pixel_shuffle"

    def state_dict_from_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        text = _text_adapter(infer_family(cfg.language))
        out, language, qkv = {}, {}, {}
        for name, value in sd.items():
            if any(re.fullmatch(p, name) for p in self.ignored_hf_tensors):
                continue
            if name.startswith(LANGUAGE_PREFIX):
                language[name.removeprefix(LANGUAGE_PREFIX)] = value
            elif m := QKV_PART.fullmatch(name):  # q, k and v: one fused projection of ours
                layer, which, param = m.groups()
                qkv.setdefault((layer, param), {})[which] = value
            elif (ours := VISION.from_hf(name)) is not None:
                out[ours] = value[None] if ours == "vision.pos_embed" else value  # ours is [1, patches, d]
            else:
                raise HFConversionError(f"unexpected tensor {name!r} in a llava checkpoint")
        for (layer, param), parts in qkv.items():
            if set(parts) != {"q", "k", "v"}:
                raise HFConversionError(f"vision layer {layer} lacks {sorted({'q', 'k', 'v'} - set(parts))}_proj")
            out[f"vision.blocks.{layer}.attn.qkv.{param}"] = torch.cat([parts["q"], parts["k"], parts["v"]])
        out.update({f"language.{k}": v for k, v in text.state_dict_from_hf(language, cfg.language).items()})
        return out

    def state_dict_to_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        _check_exportable(cfg)
        text = _text_adapter(infer_family(cfg.language))
        out, language = {}, {}
        for name, value in sd.items():
            if name.startswith("language."):
                language[name.removeprefix("language.")] = value
            elif name.startswith("vision.blocks.") and ".attn.qkv." in name:
                layer, param = name.removeprefix("vision.blocks.").split(".attn.qkv.")
                for which, part in zip("qkv", value.chunk(3)):
                    out[QKV.format(i=layer, which=which, p=param)] = part
            elif (theirs := VISION.to_hf(name)) is not None:
                out[theirs] = value[0] if name == "vision.pos_embed" else value
            else:
                raise HFConversionError(f"tensor {name!r} has no llava counterpart")
        out.update({LANGUAGE_PREFIX + k: v for k, v in text.state_dict_to_hf(language, cfg.language).items()})
        return out


def _check_exportable(cfg) -> None:
    """What a LLaVA checkpoint can hold of ``cfg``, or an error naming the field."""
    v, p = cfg.vision, cfg.projector
    if v.arch != "vit" or v.final_norm:
        raise HFConversionError("a LLaVA export needs vision.arch 'vit' with vision.final_norm false (LLaVA reads "
                                "SigLIP's last block without a norm)")
    if int(v.d_model * v.mlp_ratio) != v.d_model * v.mlp_ratio:
        raise HFConversionError(f"vision.d_model × vision.mlp_ratio ({v.d_model * v.mlp_ratio}) must be whole")
    if p.kind != "mlp" or p.hidden_dim not in (None, cfg.language.d_model):
        raise HFConversionError("a LLaVA export needs projector.kind 'mlp' whose hidden_dim is the decoder's "
                                f"d_model ({cfg.language.d_model})")


class VLMHF(DecoderHF):
    """llava checkpoints in and out, through the decoder's machinery (its adapters registry holds ``llava``)."""

    def families(self) -> list[str]:
        from longboat.models.llm.hf import hf_families

        return [f for f in hf_families() if get_hf_adapter(f).arch == "vlm"]

    def export_family(self, cfg, requested: bool | str, source: str | Path | None) -> str:
        if requested is True:  # the family whose layout this model has (llava unless another claims it)
            family = next((f for f in self.families() if get_hf_adapter(f).default_for(cfg)), "llava")
        else:
            family = requested
        if family not in self.families():
            raise HFConversionError(f"a vision-language model exports as {', '.join(self.families())}, not {family!r}")
        get_hf_adapter(family).config_to_hf(cfg)
        return family
