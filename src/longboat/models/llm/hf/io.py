"""Hugging Face checkpoint directories: config.json and safetensors (single or sharded) read and written.

Entry points: ``load_hf_model(dir, dtype=None) -> (model, cfg, family)`` (built on the meta device and filled
shard file by shard file, ``stream.HFWeights``) and
``save_hf_model(model, family, out_dir, dtype=None, tokenizer_dir=None, max_shard_size="5GB", *, cfg=None,
overwrite=None, sources=())``. Readers name the file at fault (config.json that is not JSON or lacks a key,
a truncated safetensors file); writers never delete what they should not (``longboat.utils.outputs``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Sequence

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import SafetensorError
from safetensors.torch import save_file

from longboat.errors import LongboatError
from longboat.models.llm.hf.adapter import HFAdapter, HFConversionError, get_hf_adapter
from longboat.models.llm.hf.stream import WEIGHTS_INDEX, HFWeights, open_shard, read_json, shard_error, shard_files
from longboat.utils.outputs import staged_output

HF_CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
# Carried between HF directories and our exports untouched.
SIDE_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json", GENERATION_CONFIG,
)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def read_hf_config(hf_dir: str | os.PathLike) -> dict:
    path = Path(hf_dir) / HF_CONFIG
    if not path.is_file():
        raise HFConversionError(f"{hf_dir}: not a Hugging Face checkpoint (no {HF_CONFIG})")
    return read_json(path)


def _config_from_hf(adapter: HFAdapter, hf: dict, hf_dir: str | os.PathLike) -> dict:
    """The adapter's reading of config.json, with a missing or malformed entry named with the file."""
    path = Path(hf_dir) / HF_CONFIG
    try:
        return adapter.config_from_dir(hf, hf_dir)
    except KeyError as e:
        raise HFConversionError(f"{path}: missing required key {e.args[0]!r} for model_type "
                                f"{adapter.model_type!r}") from None
    except (TypeError, ValueError, ArithmeticError) as e:
        if isinstance(e, LongboatError):  # already names what is wrong
            raise
        raise HFConversionError(f"{path}: malformed {adapter.model_type} config ({e})") from None


def read_hf_state_dict(hf_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors`` or of the shards ``model.safetensors.index.json`` names."""
    state = {}
    for path in shard_files(hf_dir):
        with open_shard(path) as f:
            try:
                state.update((key, f.get_tensor(key)) for key in f.keys())
            except (SafetensorError, OSError) as e:
                raise shard_error(path, e) from None
    return state


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise HFConversionError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def parse_size(size: int | str) -> int:
    """``5GB``, ``200MB``, ``4096`` -> bytes (decimal units, as transformers uses)."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", size.upper())
    if not m:
        raise HFConversionError(f"max_shard_size {size!r} is not a size like 5GB or 200MB")
    scale = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9}[m.group(2)]
    return int(float(m.group(1)) * scale)


def load_hf_model(hf_dir: str | os.PathLike, dtype: str | torch.dtype | None = None):
    """Build our model from an HF directory: ``(model, cfg, family)``; dtype preserved unless given.

    The model is built on the meta device and each tensor assigned, already in the target dtype, once the shard
    file completing it has been read: the import holds one copy of the weights plus one shard file's buffers.
    """
    from longboat.models import get_model

    adapter, cfg = hf_model_config(hf_dir)
    weights = HFWeights(hf_dir, adapter, cfg)
    with torch.device("meta"):
        model = get_model(adapter.arch).build(cfg)
    for group in weights.groups(resolve_dtype(dtype) or weights.stored_dtype):
        model.load_state_dict(group, strict=False, assign=True)
    left = [name for name, t in model.state_dict().items() if t.is_meta]
    if left:
        raise HFConversionError(f"{adapter.model_type} checkpoint {hf_dir} left tensors unfilled: {left[:5]}")
    model.init_buffers()  # the RoPE tables and counters no checkpoint holds, still on the meta device
    return model.eval(), cfg, adapter.model_type


def hf_config_fields(hf_dir: str | os.PathLike) -> tuple[str, dict]:
    """``(our architecture name, its config fields)`` from an HF directory's config.json, not yet validated."""
    hf = read_hf_config(hf_dir)
    adapter = get_hf_adapter(hf.get("model_type"))
    return adapter.arch, _config_from_hf(adapter, hf, hf_dir)


def hf_model_config(hf_dir: str | os.PathLike):
    """``(adapter, our validated config)`` from an HF directory's config.json."""
    from longboat.config.base import validate
    from longboat.models import get_model

    hf = read_hf_config(hf_dir)
    adapter = get_hf_adapter(hf.get("model_type"))
    config_cls = get_model(adapter.arch).config
    fields = _config_from_hf(adapter, hf, hf_dir)
    return adapter, validate(config_cls, fields, str(Path(hf_dir) / HF_CONFIG), prefix="model")


def read_hf_weights(hf_dir: str | os.PathLike, adapter: HFAdapter, cfg) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under our names, as stored, checked against the model ``cfg`` describes."""
    return {name: t for group in HFWeights(hf_dir, adapter, cfg).groups() for name, t in group.items()}


def save_hf_model(
    model: torch.nn.Module | dict[str, torch.Tensor],
    family: str,
    out_dir: str | os.PathLike,
    dtype: str | torch.dtype | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
    max_shard_size: int | str = "5GB",
    *,
    cfg=None,
    overwrite: bool | None = None,
    sources: Sequence[str | os.PathLike] = (),
) -> Path:
    """Write a transformers-loadable directory atomically (a hidden sibling filled, then renamed into place).

    ``model`` is a module with ``.cfg`` or a full state dict plus ``cfg``. Tokenizer files and
    ``generation_config.json`` are carried from ``tokenizer_dir`` when present there. An existing ``out_dir``
    is replaced only as ``overwrite`` allows (``None``: only a run's own ``hf`` directory, which training
    rewrites), and never when it is, holds or lies inside ``sources``, a run or a checkpoint.
    """
    cfg = cfg if cfg is not None else model.cfg
    adapter = get_hf_adapter(family)
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    target = resolve_dtype(dtype) or next(v.dtype for v in state.values() if v.is_floating_point())
    hf_state = {k: v.detach().to("cpu", target).contiguous() for k, v in adapter.state_dict_to_hf(state, cfg).items()}

    max_bytes = parse_size(max_shard_size)
    tokens = _special_token_ids(tokenizer_dir)
    dtype_name = str(target).removeprefix("torch.")
    config = {"architectures": [adapter.architecture], "model_type": family, **adapter.config_to_hf(cfg),
              **tokens, "dtype": dtype_name, "torch_dtype": dtype_name}
    with staged_output(out_dir, overwrite, sources) as tmp:
        _write_shards(tmp, hf_state, max_bytes)
        (tmp / HF_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        if tokenizer_dir is not None:
            for name in SIDE_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copy2(Path(tokenizer_dir) / name, tmp / name)
        if not (tmp / GENERATION_CONFIG).is_file():
            (tmp / GENERATION_CONFIG).write_text(json.dumps(tokens, indent=2) + "\n")
    return Path(out_dir)


def _write_shards(out: Path, state: dict[str, torch.Tensor], max_bytes: int) -> None:
    """``model.safetensors``, or numbered shards of at most ``max_bytes`` (a bigger tensor alone) and their index."""
    # The splitter groups tensors that share storage and sizes them by it; views (experts unbound from one
    # stacked tensor) get storage of their own so each is sized and placed by its own bytes.
    state = {k: v if v.untyped_storage().nbytes() == v.nbytes else v.clone() for k, v in state.items()}
    split = split_torch_state_dict_into_shards(state, max_shard_size=max_bytes)
    for fname, names in split.filename_to_tensors.items():
        save_file({k: state[k] for k in names}, str(out / fname), metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (out / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _special_token_ids(tokenizer_dir: str | os.PathLike | None) -> dict:
    """bos/eos ids from the carried generation_config.json, else from the tokenizer; empty when neither says."""
    if tokenizer_dir is None:
        return {}
    gen = Path(tokenizer_dir) / GENERATION_CONFIG
    if gen.is_file():
        data = read_json(gen)
        return {k: data[k] for k in ("bos_token_id", "eos_token_id") if data.get(k) is not None}
    if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return {}
    from longboat.data.tokenizer import Tokenizer

    tok = Tokenizer(tokenizer_dir)
    return {k: v for k, v in (("bos_token_id", tok.bos_id), ("eos_token_id", tok.eos_id)) if v is not None}
