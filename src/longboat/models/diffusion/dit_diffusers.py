"""DiT weights and config to and from diffusers' ``DiTTransformer2DModel`` (a pipeline's ``transformer/`` folder).

diffusers keeps a copy of the timestep and class embedding in every block (``transformer_blocks.i.norm1.emb``) and
reads block 0's for the final layer; DiT, and we, keep one. Its checkpoints of DiT's weights hold equal copies, so
reading takes block 0's after checking every other block's is the same, and writing copies ours into each block.
Its q, k and v projections become our fused qkv, head by head. A diffusers option our DiT cannot represent, or one
of ours diffusers cannot, fails naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from longboat.models.diffusion.dit import DiT, DiTConfig
from longboat.models.llm.hf.adapter import HFConversionError
from longboat.utils.json_files import read_json_object
from longboat.utils.outputs import staged_output

CLASS_NAME = "DiTTransformer2DModel"
CONFIG = "config.json"
WEIGHTS = "diffusion_pytorch_model.safetensors"
WEIGHTS_INDEX = "diffusion_pytorch_model.safetensors.index.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# What diffusers' DiT fixes and our config leaves open: the value it needs.
_FIXED = {"time_freq_shift": 1.0, "norm_eps": 1e-6, "frequency_embedding_size": 256}
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
def config_from_diffusers(d: dict, source: str = CONFIG) -> dict:
    """Our config fields from a ``DiTTransformer2DModel`` config; an option we cannot represent fails naming it."""
    unknown = sorted(k for k in d if not k.startswith("_") and k not in _MAPPED and k not in _REQUIRED)
    if unknown:
        raise HFConversionError(f"{source}: diffusers option {unknown[0]!r} is not one longboat's DiT represents")
    for key, value in _REQUIRED.items():
        if key in d and d[key] != value:
            raise HFConversionError(f"{source}: {key}={d[key]!r} is not supported; longboat's DiT has {value!r}")
    heads, head_dim, channels = d.get("num_attention_heads", 16), d.get("attention_head_dim", 72), d.get("in_channels", 4)
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


# ---- files --------------------------------------------------------------------------------------------------------
def read_config(directory: str | Path) -> dict:
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise HFConversionError(f"{directory}: no {CONFIG}")
    d = read_json_object(path, HFConversionError)
    if d.get("_class_name", CLASS_NAME) != CLASS_NAME:
        raise HFConversionError(f"{path}: _class_name {d['_class_name']!r} is not {CLASS_NAME}")
    return d


def read_state_dict(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``diffusion_pytorch_model.safetensors`` or of the shards its index names."""
    directory = Path(directory)
    if (directory / WEIGHTS_INDEX).is_file():
        weight_map = read_json_object(directory / WEIGHTS_INDEX, HFConversionError).get("weight_map")
        if not isinstance(weight_map, dict):
            raise HFConversionError(f"{directory / WEIGHTS_INDEX}: no weight_map of tensor names to shard files")
        files = [directory / name for name in sorted(set(weight_map.values()))]
    else:
        files = [directory / WEIGHTS]
    state = {}
    for path in files:
        if not path.is_file():
            raise HFConversionError(f"{directory}: no {path.name} (diffusers' safetensors weights)")
        try:
            with safe_open(str(path), framework="pt") as f:
                state.update((key, f.get_tensor(key)) for key in f.keys())
        except (SafetensorError, OSError) as e:
            raise HFConversionError(f"{path}: cannot read safetensors weights: {e}") from None
    return state


def load_diffusers(directory: str | Path, dtype: str | None = None) -> tuple[DiT, DiTConfig]:
    """Our DiT (eval mode) from a ``DiTTransformer2DModel`` directory; the stored dtype unless ``dtype`` is given."""
    cfg = DiTConfig(**config_from_diffusers(read_config(directory), str(Path(directory) / CONFIG)))
    state = state_dict_from_diffusers(read_state_dict(directory), cfg)
    if dtype is not None:
        state = {k: v.to(_DTYPES[dtype]) for k, v in state.items()}
    with torch.device("meta"):
        model = DiT(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    model.init_buffers()
    return model.eval(), cfg


def save_diffusers(weights: torch.nn.Module | dict, out: str | Path, cfg: DiTConfig, dtype: str | None = None,
                   max_shard_size: int | str = "5GB") -> Path:
    """Write a directory ``DiTTransformer2DModel.from_pretrained`` reads, atomically (a staged sibling renamed)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    from longboat.models.llm.hf.io import parse_size

    config = config_to_diffusers(cfg)
    state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
    target = _DTYPES[dtype] if dtype else next(v.dtype for v in state.values() if v.is_floating_point())
    theirs = {k: v.detach().to("cpu", target).contiguous() for k, v in state_dict_to_diffusers(state, cfg).items()}
    split = split_torch_state_dict_into_shards(theirs, filename_pattern="diffusion_pytorch_model{suffix}.safetensors",
                                               max_shard_size=parse_size(max_shard_size))
    with staged_output(out, None) as tmp:
        for fname, names in split.filename_to_tensors.items():
            save_file({k: theirs[k] for k in names}, str(tmp / fname), metadata={"format": "pt"})
        if split.is_sharded:
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
            (tmp / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return Path(out)


class DiTDiffusers:
    """The ``ModelSpec.hf`` interop of the "dit" architecture: diffusers ``DiTTransformer2DModel`` directories, told
    apart by config.json's ``_class_name``, in and out through ``longboat convert`` and a run's ``model.hf``."""

    def families(self) -> list[str]:
        return [CLASS_NAME]

    def load(self, hf_dir: str | Path, dtype: str | None = None) -> tuple[Any, DiTConfig, str, dict]:
        model, cfg = load_diffusers(hf_dir, dtype)
        return model, cfg, CLASS_NAME, {}

    def config_fields(self, hf_dir: str | Path) -> dict:
        return config_from_diffusers(read_config(hf_dir), str(Path(hf_dir) / CONFIG))

    def read_weights(self, hf_dir: str | Path, cfg: DiTConfig) -> dict:
        return state_dict_from_diffusers(read_state_dict(hf_dir), cfg)

    def stream_weights(self, hf_dir: str | Path, cfg: DiTConfig) -> Iterator[dict]:
        yield self.read_weights(hf_dir, cfg)  # one group: a DiT's weights are read whole

    def export_family(self, cfg: DiTConfig, requested: bool | str, source: str | Path | None) -> str:
        if requested not in (True, CLASS_NAME):
            raise HFConversionError(f"family {requested!r}: longboat's DiT converts to {CLASS_NAME} only")
        config_to_diffusers(cfg)  # raises, naming the setting, when diffusers cannot hold cfg
        return CLASS_NAME

    def tensor_name(self, family: str, name: str) -> str | None:
        return tensor_name(name)

    def save(self, weights: Any, family: str, out: str | Path, cfg: DiTConfig, tokenizer_dir: str | Path | None = None,
             dtype: str | None = None, max_shard_size: int | str = "5GB") -> Path:
        return save_diffusers(weights, out, cfg, dtype, max_shard_size)
