"""AutoencoderKL weights and config to and from diffusers' ``AutoencoderKL`` (a pipeline's ``vae/`` folder). Every
tensor is one renamed; other block types, activations and per-channel latent statistics fail naming their option.
``sample_size`` and ``force_upcast`` only steer diffusers' tiling and fp16 pipelines: they are read and dropped, and
a written config leaves them at diffusers' defaults."""

from __future__ import annotations


import torch

from longboat.models.diffusion.diffusers_interop import DiffusersFormat, rename, rename_state, rules
from longboat.models.diffusion.vae import AutoencoderKL, VAEConfig
from longboat.models.llm.hf.adapter import HFConversionError

CLASS_NAME = "AutoencoderKL"
_DROPPED = ("sample_size", "force_upcast")
_REQUIRED = {"act_fn": "silu", "latents_mean": None, "latents_std": None}
_BLOCKS = {"down_block_types": "DownEncoderBlock2D", "up_block_types": "UpDecoderBlock2D"}
_FIELDS = {  # diffusers option -> (our field, diffusers' default when the config omits it)
    "in_channels": ("in_channels", 3), "out_channels": ("out_channels", 3),
    "block_out_channels": ("block_out_channels", (64,)), "layers_per_block": ("layers_per_block", 1),
    "latent_channels": ("latent_channels", 4), "norm_num_groups": ("norm_num_groups", 32),
    "mid_block_add_attention": ("mid_block_attention", True), "use_quant_conv": ("use_quant_conv", True),
    "use_post_quant_conv": ("use_post_quant_conv", True), "scaling_factor": ("scaling_factor", 0.18215),
    "shift_factor": ("shift_factor", None),
}


def _names() -> list[tuple[str, str]]:
    """ours -> diffusers; {i}, {j}: indices, {p}: weight or bias."""
    res = [(r, r) for r in ("norm1", "conv1", "norm2", "conv2")] + [("skip", "conv_shortcut")]
    attn = [("norm", "group_norm"), ("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0")]
    names = [("quant_conv.{p}", "quant_conv.{p}"), ("post_quant_conv.{p}", "post_quant_conv.{p}")]
    for side, stages, blocks, resample in (("encoder", "down", "down_blocks", "downsamplers"),
                                           ("decoder", "up", "up_blocks", "upsamplers")):
        names += [(f"{side}.{n}.{{p}}", f"{side}.{n}.{{p}}") for n in ("conv_in", "conv_out")]
        names.append((f"{side}.norm_out.{{p}}", f"{side}.conv_norm_out.{{p}}"))
        names += [(f"{side}.mid.res.{{i}}.{a}.{{p}}", f"{side}.mid_block.resnets.{{i}}.{b}.{{p}}") for a, b in res]
        names += [(f"{side}.mid.attn.{a}.{{p}}", f"{side}.mid_block.attentions.0.{b}.{{p}}") for a, b in attn]
        names += [(f"{side}.{stages}.{{i}}.res.{{j}}.{a}.{{p}}", f"{side}.{blocks}.{{i}}.resnets.{{j}}.{b}.{{p}}")
                  for a, b in res]
        names.append((f"{side}.{stages}.{{i}}.resample.conv.{{p}}", f"{side}.{blocks}.{{i}}.{resample}.0.conv.{{p}}"))
    return names


_TO_THEIRS = rules(_names())
# Checkpoints saved before diffusers renamed its attention layers name them query/key/value/proj_attn.
_LEGACY = [(f"{side}.mid_block.attentions.0.{old}.{{p}}", f"{side}.mid.attn.{new}.{{p}}")
           for side in ("encoder", "decoder")
           for old, new in (("query", "q"), ("key", "k"), ("value", "v"), ("proj_attn", "o"))]
_TO_OURS = rules([(theirs, ours) for ours, theirs in _names()] + _LEGACY)


def config_from_diffusers(d: dict, source: str = "config.json") -> dict:
    """Our config fields from an ``AutoencoderKL`` config; an option we cannot represent fails naming it."""
    known = set(_FIELDS) | set(_REQUIRED) | set(_BLOCKS) | set(_DROPPED)
    unknown = sorted(k for k in d if not k.startswith("_") and k not in known)
    if unknown:
        raise HFConversionError(f"{source}: diffusers option {unknown[0]!r} is not one longboat's AutoencoderKL "
                                "represents")
    d = {**d, "act_fn": "silu"} if d.get("act_fn") == "swish" else d  # diffusers' other name for SiLU
    for key, value in _REQUIRED.items():
        if d.get(key, value) != value:
            raise HFConversionError(f"{source}: {key}={d[key]!r} is not supported; longboat's AutoencoderKL has "
                                    f"{value!r}")
    fields = {ours: d.get(theirs, default) for theirs, (ours, default) in _FIELDS.items()}
    fields["block_out_channels"] = tuple(fields["block_out_channels"])
    stages = len(fields["block_out_channels"])
    for key, block in _BLOCKS.items():
        types = list(d.get(key, [block]))
        if types != [block] * stages:
            raise HFConversionError(f"{source}: {key}={types!r} is not supported; longboat's AutoencoderKL has "
                                    f"{block!r} for each of the {stages} block_out_channels")
    return fields


def config_to_diffusers(cfg: VAEConfig) -> dict:
    """``AutoencoderKL``'s config for ``cfg``."""
    out = {theirs: getattr(cfg, ours) for theirs, (ours, _) in _FIELDS.items()}
    out["block_out_channels"] = list(cfg.block_out_channels)
    stages = len(cfg.block_out_channels)
    return {"_class_name": CLASS_NAME, **out, **{k: [v] * stages for k, v in _BLOCKS.items()}, **_REQUIRED}


def state_dict_from_diffusers(theirs: dict[str, torch.Tensor], cfg: VAEConfig) -> dict[str, torch.Tensor]:
    return rename_state(theirs, _TO_OURS, "diffusers AutoencoderKL")


def state_dict_to_diffusers(ours: dict[str, torch.Tensor], cfg: VAEConfig) -> dict[str, torch.Tensor]:
    return rename_state(ours, _TO_THEIRS, "longboat AutoencoderKL")


def tensor_name(name: str) -> str | None:
    return rename(name, _TO_THEIRS)


VAE_FORMAT = DiffusersFormat(CLASS_NAME, VAEConfig, AutoencoderKL, config_from_diffusers, config_to_diffusers,
                             state_dict_from_diffusers, state_dict_to_diffusers, tensor_name)
