"""Wan weights and config to and from diffusers' ``WanTransformer3DModel`` (text-to-video; a pipeline's
``transformer/`` folder). Every tensor is one renamed; image conditioning (Wan I2V's image embedder and added
key/value projections) has no counterpart and fails naming its option."""

from __future__ import annotations


import torch

from longboat.models.diffusion.diffusers_interop import DiffusersFormat, rename, rename_state, rules
from longboat.models.diffusion.wan import Wan, WanConfig
from longboat.models.llm.hf.adapter import HFConversionError

CLASS_NAME = "WanTransformer3DModel"
_REQUIRED = {"image_dim": None, "added_kv_proj_dim": None, "pos_embed_seq_len": None,
             "qk_norm": "rms_norm_across_heads"}
_FIELDS = {  # diffusers option -> our field
    "patch_size": "patch_size", "in_channels": "in_channels", "out_channels": "out_channels",
    "text_dim": "text_dim", "freq_dim": "freq_dim", "ffn_dim": "ffn_dim", "num_layers": "depth",
    "cross_attn_norm": "cross_attn_norm", "eps": "eps", "rope_max_seq_len": "rope_max_seq_len",
    "num_attention_heads": "num_heads",
}
_NAMES = [  # ours -> diffusers ({i}: a block index)
    ("patch_embed.{p}", "patch_embedding.{p}"),
    ("time_mlp.0.{p}", "condition_embedder.time_embedder.linear_1.{p}"),
    ("time_mlp.2.{p}", "condition_embedder.time_embedder.linear_2.{p}"),
    ("time_proj.{p}", "condition_embedder.time_proj.{p}"),
    ("text_mlp.0.{p}", "condition_embedder.text_embedder.linear_1.{p}"),
    ("text_mlp.2.{p}", "condition_embedder.text_embedder.linear_2.{p}"),
    *[(f"blocks.{{i}}.{ours}_attn.{a}.{{p}}", f"blocks.{{i}}.{theirs}.{b}.{{p}}")
      for ours, theirs in (("self", "attn1"), ("cross", "attn2"))
      for a, b in (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"), ("q_norm", "norm_q"),
                   ("k_norm", "norm_k"))],
    ("blocks.{i}.norm2.{p}", "blocks.{i}.norm2.{p}"),
    ("blocks.{i}.fc1.{p}", "blocks.{i}.ffn.net.0.proj.{p}"),
    ("blocks.{i}.fc2.{p}", "blocks.{i}.ffn.net.2.{p}"),
    ("blocks.{i}.modulation", "blocks.{i}.scale_shift_table"),
    ("final.modulation", "scale_shift_table"),
    ("final.linear.{p}", "proj_out.{p}"),
]


_TO_THEIRS = rules(_NAMES)
_TO_OURS = rules([(theirs, ours) for ours, theirs in _NAMES])


def config_from_diffusers(d: dict, source: str = "config.json") -> dict:
    """Our config fields from a ``WanTransformer3DModel`` config; an option we cannot represent fails naming it."""
    unknown = sorted(k for k in d if not k.startswith("_") and k not in _FIELDS and k not in _REQUIRED
                     and k != "attention_head_dim")
    if unknown:
        raise HFConversionError(f"{source}: diffusers option {unknown[0]!r} is not one longboat's Wan represents")
    for key, value in _REQUIRED.items():
        if d.get(key, value) != value:
            raise HFConversionError(f"{source}: {key}={d[key]!r} is not supported; longboat's Wan has {value!r} "
                                    "(text-to-video only)")
    fields = {ours: d[theirs] for theirs, ours in _FIELDS.items() if theirs in d}
    if "patch_size" in fields:
        fields["patch_size"] = tuple(fields["patch_size"])
    heads = d.get("num_attention_heads", 40)
    fields["hidden_size"] = heads * d.get("attention_head_dim", 128)
    fields["num_heads"] = heads
    return fields


def config_to_diffusers(cfg: WanConfig) -> dict:
    """``WanTransformer3DModel``'s config for ``cfg`` (rope_theta is fixed to 10000 there)."""
    if cfg.rope_theta != 10000.0:
        raise HFConversionError(f"model.rope_theta={cfg.rope_theta} has no diffusers counterpart: its Wan uses 10000")
    out = {theirs: getattr(cfg, ours) for theirs, ours in _FIELDS.items()}
    out["patch_size"] = list(cfg.patch_size)
    out["out_channels"] = cfg.channels_out
    out["attention_head_dim"] = cfg.head_dim
    return {"_class_name": CLASS_NAME, **out, **_REQUIRED}


def state_dict_from_diffusers(theirs: dict[str, torch.Tensor], cfg: WanConfig) -> dict[str, torch.Tensor]:
    return rename_state(theirs, _TO_OURS, "diffusers Wan")


def state_dict_to_diffusers(ours: dict[str, torch.Tensor], cfg: WanConfig) -> dict[str, torch.Tensor]:
    return rename_state(ours, _TO_THEIRS, "longboat Wan")


def tensor_name(name: str) -> str | None:
    return rename(name, _TO_THEIRS)


WAN_FORMAT = DiffusersFormat(CLASS_NAME, WanConfig, Wan, config_from_diffusers, config_to_diffusers,
                             state_dict_from_diffusers, state_dict_to_diffusers, tensor_name)
