"""Wan VAE weights and config to and from diffusers' ``AutoencoderKLWan`` (a Wan 2.1 pipeline's ``vae/`` folder).
Every tensor is one renamed; RMS-norm scales and the attention's 1×1 convolutions change only their shape. Wan 2.2's
options (``is_residual``, ``patch_size``) and the others we do not represent fail naming the option.
``scale_factor_temporal`` / ``scale_factor_spatial`` are diffusers' pipeline metadata, not the layout (a tiny config
keeps 4 and 8): they are read and dropped, and a written config gives the layout's own factors."""

from __future__ import annotations


import torch

from longboat.models.diffusion.diffusers_interop import DiffusersFormat, rename, rename_state, rules
from longboat.models.diffusion.wan_vae import WanVAE, WanVAEConfig
from longboat.models.llm.hf.adapter import HFConversionError

CLASS_NAME = "AutoencoderKLWan"
_REQUIRED = {"attn_scales": [], "is_residual": False, "patch_size": None, "dropout": 0.0}
_FIELDS = {  # diffusers option -> (our field, diffusers' default when the config omits it)
    "base_dim": ("base_dim", 96), "decoder_base_dim": ("decoder_base_dim", None), "z_dim": ("z_dim", 16),
    "dim_mult": ("dim_mult", (1, 2, 4, 4)), "num_res_blocks": ("num_res_blocks", 2),
    "temperal_downsample": ("temporal_downsample", (False, True, True)),
    "latents_mean": ("latents_mean", WanVAEConfig().latents_mean),
    "latents_std": ("latents_std", WanVAEConfig().latents_std),
    "in_channels": ("in_channels", 3), "out_channels": ("out_channels", 3),
}
_DERIVED = {"scale_factor_temporal": "temporal_factor", "scale_factor_spatial": "spatial_factor"}


def _names() -> list[tuple[str, str]]:
    """ours -> diffusers; {i}, {j}: indices, {p}: weight or bias."""
    res = [("norm1.weight", "norm1.gamma"), ("norm2.weight", "norm2.gamma")] + [
        (f"{a}.{{p}}", f"{b}.{{p}}") for a, b in (("conv1", "conv1"), ("conv2", "conv2"), ("skip", "conv_shortcut"))]
    attn = [("norm.weight", "norm.gamma"), ("qkv.{p}", "to_qkv.{p}"), ("proj.{p}", "proj.{p}")]
    names = [(f"{c}.{{p}}", f"{c}.{{p}}") for c in ("quant_conv", "post_quant_conv")]
    for side in ("encoder", "decoder"):
        names += [(f"{side}.{c}.{{p}}", f"{side}.{c}.{{p}}") for c in ("conv_in", "conv_out")]
        names.append((f"{side}.norm_out.weight", f"{side}.norm_out.gamma"))
        names += [(f"{side}.mid.res.{{i}}.{a}", f"{side}.mid_block.resnets.{{i}}.{b}") for a, b in res]
        names += [(f"{side}.mid.attn.{a}", f"{side}.mid_block.attentions.0.{b}") for a, b in attn]
    names += [(f"encoder.down.{{i}}.{a}", f"encoder.down_blocks.{{i}}.{b}") for a, b in res]
    names += [(f"decoder.up.{{i}}.res.{{j}}.{a}", f"decoder.up_blocks.{{i}}.resnets.{{j}}.{b}") for a, b in res]
    for ours, theirs in (("encoder.down.{i}", "encoder.down_blocks.{i}"),
                         ("decoder.up.{i}.upsample", "decoder.up_blocks.{i}.upsamplers.0")):
        names += [(f"{ours}.conv.{{p}}", f"{theirs}.resample.1.{{p}}"), (f"{ours}.time_conv.{{p}}",
                                                                          f"{theirs}.time_conv.{{p}}")]
    return names


_TO_THEIRS = rules(_names())
_TO_OURS = rules([(theirs, ours) for ours, theirs in _names()])


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def config_from_diffusers(d: dict, source: str = "config.json") -> dict:
    """Our config fields from an ``AutoencoderKLWan`` config; an option we cannot represent fails naming it."""
    known = set(_FIELDS) | set(_REQUIRED) | set(_DERIVED)
    unknown = sorted(k for k in d if not k.startswith("_") and k not in known)
    if unknown:
        raise HFConversionError(f"{source}: diffusers option {unknown[0]!r} is not one longboat's Wan VAE represents")
    for key, value in _REQUIRED.items():
        if _as_list(d.get(key, value)) != value:
            raise HFConversionError(f"{source}: {key}={d[key]!r} is not supported (Wan 2.2's VAE options are not "
                                    f"represented); longboat's Wan VAE has {value!r}")
    fields = {ours: d.get(theirs, default) for theirs, (ours, default) in _FIELDS.items()}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    return fields


def config_to_diffusers(cfg: WanVAEConfig) -> dict:
    """``AutoencoderKLWan``'s config for ``cfg``."""
    out = {theirs: _as_list(getattr(cfg, ours)) for theirs, (ours, _) in _FIELDS.items()}
    derived = {key: getattr(cfg, prop) for key, prop in _DERIVED.items()}
    return {"_class_name": CLASS_NAME, **out, **_REQUIRED, **derived}


def _reshape(state: dict[str, torch.Tensor], to_theirs: bool) -> dict[str, torch.Tensor]:
    """RMS-norm scales [C] <-> [C, 1, 1(, 1)]; the attention's linear weights [O, I] <-> 1×1 convolutions."""
    out = {}
    for name, t in state.items():
        attention = ".attentions.0." in name if to_theirs else ".attn." in name
        if name.endswith(("norm1.gamma", "norm2.gamma", "norm_out.gamma", "norm.gamma")) and to_theirs:
            t = t.reshape(-1, 1, 1) if attention else t.reshape(-1, 1, 1, 1)
        elif name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight", "norm.weight")) and not to_theirs:
            t = t.reshape(-1)
        elif attention and name.endswith("weight") and "norm" not in name:
            t = t[:, :, None, None] if to_theirs else t.reshape(t.shape[0], t.shape[1])
        out[name] = t
    return out


def state_dict_from_diffusers(theirs: dict[str, torch.Tensor], cfg: WanVAEConfig) -> dict[str, torch.Tensor]:
    return _reshape(rename_state(theirs, _TO_OURS, "diffusers AutoencoderKLWan"), to_theirs=False)


def state_dict_to_diffusers(ours: dict[str, torch.Tensor], cfg: WanVAEConfig) -> dict[str, torch.Tensor]:
    return _reshape(rename_state(ours, _TO_THEIRS, "longboat Wan VAE"), to_theirs=True)


def tensor_name(name: str) -> str | None:
    return rename(name, _TO_THEIRS)


WAN_VAE_FORMAT = DiffusersFormat(CLASS_NAME, WanVAEConfig, WanVAE, config_from_diffusers, config_to_diffusers,
                                 state_dict_from_diffusers, state_dict_to_diffusers, tensor_name)
