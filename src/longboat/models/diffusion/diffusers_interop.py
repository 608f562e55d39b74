"""diffusers model directories (``config.json`` naming the class in ``_class_name``, and
``diffusion_pytorch_model.safetensors`` or shards with their index) read and written for any family that declares
a ``DiffusersFormat``: its diffusers class, and its config and state-dict mappings both ways. ``DiffusersInterop``
presents one format as a ``ModelSpec``'s ``hf`` interop, so ``longboat convert`` and a run's ``model.hf`` read and
write it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from longboat.config.base import StrictModel
from longboat.models.llm.hf.adapter import HFConversionError
from longboat.utils.json_files import read_json_object
from longboat.utils.outputs import staged_output

CONFIG = "config.json"
WEIGHTS = "diffusion_pytorch_model.safetensors"
WEIGHTS_INDEX = "diffusion_pytorch_model.safetensors.index.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DiffusersFormat:
    """One diffusers model class and how our family maps to it. ``config_from(d, source)``: our config fields from
    its config (an option we cannot represent fails naming it); ``config_to(cfg)``: its config; ``state_from`` /
    ``state_to(state, cfg)``: the state dict renamed; ``tensor_name(ours)``: one tensor's diffusers name or None."""

    class_name: str
    config: type[StrictModel]
    module: type[torch.nn.Module]
    config_from: Callable[[dict, str], dict]
    config_to: Callable[[Any], dict]
    state_from: Callable[[dict, Any], dict]
    state_to: Callable[[dict, Any], dict]
    tensor_name: Callable[[str], str | None]


Rules = list[tuple[re.Pattern, str]]  # (a full-name regex with named groups, the target name's format string)
_FIELDS = {"i": r"\d+", "j": r"\d+", "p": "weight|bias"}  # block index, inner index, parameter


def name_pattern(template: str) -> re.Pattern:
    """A whole-name regex from a template such as ``blocks.{i}.attn.{p}``: ``{i}``/``{j}`` match an index and
    ``{p}`` ``weight`` or ``bias``, captured under those names for the target's format string."""
    pattern = re.escape(template)
    for key, part in _FIELDS.items():
        pattern = pattern.replace(rf"\{{{key}\}}", f"(?P<{key}>{part})")
    return re.compile(pattern + r"\Z")


def rules(pairs: list[tuple[str, str]]) -> Rules:
    """Renaming rules from (source template, target template) pairs."""
    return [(name_pattern(source), target) for source, target in pairs]


def rename(name: str, rules: Rules) -> str | None:
    """``name`` under the first rule whose regex matches it; None when none does."""
    for regex, target in rules:
        if m := regex.match(name):
            return target.format(**m.groupdict())
    return None


def rename_state(state: dict[str, torch.Tensor], rules: Rules, what: str) -> dict[str, torch.Tensor]:
    """Every tensor of ``state`` under its new name; one that no rule names fails, saying whose weight it is."""
    out = {}
    for name, tensor in state.items():
        target = rename(name, rules)
        if target is None:
            raise HFConversionError(f"{what} weight {name} has no counterpart")
        out[target] = tensor
    return out


def read_config(directory: str | Path, class_name: str) -> dict:
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise HFConversionError(f"{directory}: no {CONFIG}")
    d = read_json_object(path, HFConversionError)
    if d.get("_class_name", class_name) != class_name:
        raise HFConversionError(f"{path}: _class_name {d['_class_name']!r} is not {class_name}")
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


def load_diffusers(fmt: DiffusersFormat, directory: str | Path, dtype: str | None = None) -> tuple[Any, Any]:
    """``(model in eval mode, config)`` from a diffusers directory; the stored dtype unless ``dtype`` is given."""
    cfg = fmt.config(**fmt.config_from(read_config(directory, fmt.class_name), str(Path(directory) / CONFIG)))
    state = fmt.state_from(read_state_dict(directory), cfg)
    if dtype is not None:
        state = {k: v.to(_DTYPES[dtype]) for k, v in state.items()}
    with torch.device("meta"):
        model = fmt.module(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    model.init_buffers()  # the tables no checkpoint holds, still on the meta device
    return model.eval(), cfg


def save_diffusers(fmt: DiffusersFormat, weights: torch.nn.Module | dict, out: str | Path, cfg: Any,
                   dtype: str | None = None, max_shard_size: int | str = "5GB") -> Path:
    """Write a directory the diffusers class's ``from_pretrained`` reads, atomically (a staged sibling renamed)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    from longboat.models.llm.hf.io import parse_size

    config = fmt.config_to(cfg)
    state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
    target = _DTYPES[dtype] if dtype else next(v.dtype for v in state.values() if v.is_floating_point())
    theirs = {k: v.detach().to("cpu", target).contiguous() for k, v in fmt.state_to(state, cfg).items()}
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


class DiffusersInterop:
    """A ``DiffusersFormat`` as a ``ModelSpec.hf`` interop: its directories, told apart by config.json's
    ``_class_name``, in and out through ``longboat convert`` and a run's ``model.hf``."""

    def __init__(self, fmt: DiffusersFormat):
        self.fmt = fmt

    def families(self) -> list[str]:
        return [self.fmt.class_name]

    def load(self, hf_dir: str | Path, dtype: str | None = None) -> tuple[Any, Any, str, dict]:
        model, cfg = load_diffusers(self.fmt, hf_dir, dtype)
        return model, cfg, self.fmt.class_name, {}

    def config_fields(self, hf_dir: str | Path) -> dict:
        return self.fmt.config_from(read_config(hf_dir, self.fmt.class_name), str(Path(hf_dir) / CONFIG))

    def read_weights(self, hf_dir: str | Path, cfg: Any) -> dict:
        return self.fmt.state_from(read_state_dict(hf_dir), cfg)

    def stream_weights(self, hf_dir: str | Path, cfg: Any) -> Iterator[dict]:
        yield self.read_weights(hf_dir, cfg)  # one group: the diffusion models here are read whole

    def export_family(self, cfg: Any, requested: bool | str, source: str | Path | None) -> str:
        if requested not in (True, self.fmt.class_name):
            raise HFConversionError(f"family {requested!r}: this model converts to {self.fmt.class_name} only")
        self.fmt.config_to(cfg)  # raises, naming the setting, when diffusers cannot hold cfg
        return self.fmt.class_name

    def tensor_name(self, family: str, name: str) -> str | None:
        return self.fmt.tensor_name(name)

    def save(self, weights: Any, family: str, out: str | Path, cfg: Any, tokenizer_dir: str | Path | None = None,
             dtype: str | None = None, max_shard_size: int | str = "5GB") -> Path:
        return save_diffusers(self.fmt, weights, out, cfg, dtype, max_shard_size)
