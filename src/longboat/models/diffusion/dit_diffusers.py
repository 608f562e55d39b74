"""DiT weights and config to and from diffusers' ``DiTTransformer2DModel`` (a pipeline's ``transformer/`` folder).

diffusers keeps a copy of the timestep and class embedding in every block (``transformer_blocks.i.norm1.emb``) and
reads block 0's for the final layer; DiT, and we, keep one. Its checkpoints of DiT's weights hold equal copies, so
reading takes block 0's after checking every other block's is the same, and writing copies ours into each block.
Its q, k and v projections become our fused qkv, head by head. A diffusers option our DiT cannot represent, or one
of ours diffusers cannot, fails naming it.
"""

from __future__ import annotations

import torch

from longboat.models.diffusion.diffusers_interop import DiffusersFormat
from longboat.models.diffusion.dit import DiT, DiTConfig
from longboat.models.llm.hf.adapter import HFConversionError

CLASS_NAME = "DiTTransformer2DModel"

# What diffusers' DiT fixes and our config leaves open: the value it needs.
_FIXED = {"time_freq_shift": 1.0, "norm_eps": 1e-6, "frequency_embedding_size": 256, "text_dim": None}
# diffusers options with the one value we represent (the rest map to fields below).
_REQUIRED = {"dropout": 0.0, "activation_fn": "gelu-approximate", "upcast_attention": False,
             "norm_type": "ada_norm_zero", "norm_elementwise_affine": False}
_MAPPED = {"num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "num_layers", "attention_bias",
           "sample_size", "patch_size", "num_embeds_ada_norm", "norm_eps", "norm_num_groups"}
_EMBEDDING = {  # ours -> block i's name in diffusers
    "time_mlp.0.weight": "norm1.emb.timestep_embedder.linear_1.weight",
    "time_mlp.0.bias": "norm1.emb.timestep_embedder.linear_1.bias",
    "time_mlp.2.weight": "norm1.emb.timestep_embedder.linear_2.weight",
    "time_mlp.2.bias": "norm1.emb.timestep_embedder.linear_2.bias",
    "label_embed.weight": "norm1.emb.class_embedder.embedding_table.weight",
}
_RENAMED = {  # ours -> diffusers, one tensor each ({i}: the block index)
    "patch_embed.weight": "pos_embed.proj.weight",
    "patch_embed.bias": "pos_embed.proj.bias",
    "blocks.{i}.modulation.weight": "transformer_blocks.{i}.norm1.linear.weight",
    "blocks.{i}.modulation.bias": "transformer_blocks.{i}.norm1.linear.bias",
    "blocks.{i}.attn.proj.weight": "transformer_blocks.{i}.attn1.to_out.0.weight",
    "blocks.{i}.attn.proj.bias": "transformer_blocks.{i}.attn1.to_out.0.bias",
    "blocks.{i}.mlp.fc1.weight": "transformer_blocks.{i}.ff.net.0.proj.weight",
    "blocks.{i}.mlp.fc1.bias": "transformer_blocks.{i}.ff.net.0.proj.bias",
    "blocks.{i}.mlp.fc2.weight": "transformer_blocks.{i}.ff.net.2.weight",
    "blocks.{i}.mlp.fc2.bias": "transformer_blocks.{i}.ff.net.2.bias",
    "final.modulation.weight": "proj_out_1.weight",
    "final.modulation.bias": "proj_out_1.bias",
    "final.linear.weight": "proj_out_2.weight",
    "final.linear.bias": "proj_out_2.bias",
}


# ---- config -------------------------------------------------------------------------------------------------------
def config_from_diffusers(d: dict, source: str = "config.json") -> dict:
    """Our config fields from a ``DiTTransformer2DModel`` config; an option we cannot represent fails naming it."""
    unknown = sorted(k for k in d if not k.startswith("_") and k not in _MAPPED and k not in _REQUIRED)
    if unknown:
        raise HFConversionError(f"{source}: diffusers option {unknown[0]!r} is not one longboat's DiT represents")
    for key, value in _REQUIRED.items():
        if key in d and d[key] != value:
            raise HFConversionError(f"{source}: {key}={d[key]!r} is not supported; longboat's DiT has {value!r}")
    heads, head_dim = d.get("num_attention_heads", 16), d.get("attention_head_dim", 72)
    channels = d.get("in_channels", 4)
    out = d.get("out_channels") or channels
    if out not in (channels, 2 * channels):
        raise HFConversionError(f"{source}: out_channels={out} is not supported; longboat's DiT outputs in_channels "
                                f"({channels}) or, with learned sigma, twice as many")
    classes = d.get("num_embeds_ada_norm", 1000)
    if not isinstance(classes, int):
        raise HFConversionError(f"{source}: num_embeds_ada_norm={classes!r}; longboat's DiT needs a class count")
    return {
        "image_size": d.get("sample_size", 32), "in_channels": channels, "patch_size": d.get("patch_size", 2),
        "hidden_size": heads * head_dim, "depth": d.get("num_layers", 28), "num_heads": heads, "mlp_ratio": 4.0,
        "num_classes": classes, "learn_sigma": out == 2 * channels, "qkv_bias": d.get("attention_bias", True),
        "time_scale": 1000.0, "mlp_norm_eps": d.get("norm_eps", 1e-5), **_FIXED,
    }


def config_to_diffusers(cfg: DiTConfig) -> dict:
    """``DiTTransformer2DModel``'s config for ``cfg``; a setting diffusers fixes otherwise fails naming it."""
    for field, value in _FIXED.items():
        if getattr(cfg, field) != value:
            raise HFConversionError(f"model.{field}={getattr(cfg, field)!r} has no diffusers counterpart: its DiT "
                                    f"uses {value!r}")
    if cfg.mlp_hidden != 4 * cfg.hidden_size:
        raise HFConversionError(f"model.mlp_ratio={cfg.mlp_ratio} has no diffusers counterpart: its DiT's MLP is 4 × "
                                "hidden_size wide")
    return {
        "_class_name": CLASS_NAME, "num_attention_heads": cfg.num_heads,
        "attention_head_dim": cfg.hidden_size // cfg.num_heads, "in_channels": cfg.in_channels,
        "out_channels": cfg.out_channels, "num_layers": cfg.depth, "attention_bias": cfg.qkv_bias,
        "sample_size": cfg.image_size, "patch_size": cfg.patch_size, "num_embeds_ada_norm": cfg.num_classes,
        "norm_eps": cfg.norm_eps if cfg.mlp_norm_eps is None else cfg.mlp_norm_eps, **_REQUIRED,
    }


# ---- weights ------------------------------------------------------------------------------------------------------
def _per_block(template: str, depth: int) -> list[tuple[str | None, str]]:
    return [(None, template)] if "{i}" not in template else [(str(i), template.replace("{i}", str(i)))
                                                                for i in range(depth)]


def state_dict_from_diffusers(theirs: dict[str, torch.Tensor], cfg: DiTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a ``DiTTransformer2DModel`` state dict (names checked both ways)."""
    ours: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in theirs:
            raise HFConversionError(f"diffusers DiT weights lack {name}")
        used.add(name)
        return theirs[name]

    for our_template, their_template in _RENAMED.items():
        for i, name in _per_block(their_template, cfg.depth):
            ours[our_template.replace("{i}", i) if i else our_template] = take(name)
    for our_name, suffix in _EMBEDDING.items():
        first = ours[our_name] = take(f"transformer_blocks.0.{suffix}")
        for i in range(1, cfg.depth):
            name = f"transformer_blocks.{i}.{suffix}"
            if not torch.equal(take(name), first):
                raise HFConversionError(f"diffusers DiT weight {name} differs from block 0's: longboat's DiT shares "
                                        "one timestep and class embedding across blocks, as DiT's checkpoints do")
    head_dim = cfg.hidden_size // cfg.num_heads
    for i in range(cfg.depth):
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            q, k, v = (take(f"transformer_blocks.{i}.attn1.to_{p}.{kind}") for p in "qkv")
            # [3, heads, head_dim, ...] -> [heads, 3, head_dim, ...]: each head's q, k, v together.
            stacked = torch.stack([t.reshape(cfg.num_heads, head_dim, *t.shape[1:]) for t in (q, k, v)], dim=1)
            ours[f"blocks.{i}.attn.qkv.{kind}"] = stacked.reshape(3 * cfg.hidden_size, *q.shape[1:])
    extra = sorted(set(theirs) - used)
    if extra:
        raise HFConversionError(f"diffusers DiT weight {extra[0]} has no counterpart in longboat's DiT "
                                f"({len(extra)} such)")
    return ours


def state_dict_to_diffusers(ours: dict[str, torch.Tensor], cfg: DiTConfig) -> dict[str, torch.Tensor]:
    """A ``DiTTransformer2DModel`` state dict from ours (the shared embeddings copied into every block)."""
    theirs: dict[str, torch.Tensor] = {}
    for our_template, their_template in _RENAMED.items():
        for i, name in _per_block(their_template, cfg.depth):
            theirs[name] = ours[our_template.replace("{i}", i) if i else our_template]
    head_dim = cfg.hidden_size // cfg.num_heads
    for i in range(cfg.depth):
        for suffix, our_name in ((s, o) for o, s in _EMBEDDING.items()):
            theirs[f"transformer_blocks.{i}.{suffix}"] = ours[our_name].clone()  # a tensor of its own per block
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            qkv = ours[f"blocks.{i}.attn.qkv.{kind}"]
            split = qkv.reshape(cfg.num_heads, 3, head_dim, *qkv.shape[1:])
            for j, p in enumerate("qkv"):
                theirs[f"transformer_blocks.{i}.attn1.to_{p}.{kind}"] = (
                    split[:, j].reshape(cfg.hidden_size, *qkv.shape[1:]).contiguous())
    return theirs


def tensor_name(name: str) -> str | None:
    """Our tensor's diffusers name; None for the fused qkv and the shared embeddings, which have no single one."""
    parts = name.split(".")
    index = parts[1] if parts[0] == "blocks" and len(parts) > 2 else None
    template = ".".join(["blocks", "{i}", *parts[2:]]) if index is not None else name
    their = _RENAMED.get(template)
    return None if their is None else their.replace("{i}", index or "")


DIT_FORMAT = DiffusersFormat(CLASS_NAME, DiTConfig, DiT, config_from_diffusers, config_to_diffusers,
                             state_dict_from_diffusers, state_dict_to_diffusers, tensor_name)
