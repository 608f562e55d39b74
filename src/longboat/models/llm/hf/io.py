"""Hugging Face checkpoint directories: config.json and safetensors (single or sharded) read and written.

Entry points: ``load_hf_model(dir, dtype=None) -> (model, cfg, family)`` and
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
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from longboat.errors import LongboatError
from longboat.models.llm.hf.adapter import HFAdapter, HFConversionError, get_hf_adapter
from longboat.utils.outputs import staged_output

HF_CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
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
    return _read_json(path)


def _read_json(path: Path) -> dict:
    """A JSON object from ``path``; an error naming the file when it is unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFConversionError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise HFConversionError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _config_from_hf(adapter: HFAdapter, hf: dict, hf_dir: str | os.PathLike) -> dict:
    """The adapter's reading of config.json, with a missing or malformed entry named with the file."""
    path = Path(hf_dir) / HF_CONFIG
    try:
        return adapter.config_from_hf(hf)
    except KeyError as e:
        raise HFConversionError(f"{path}: missing required key {e.args[0]!r} for model_type "
                                f"{adapter.model_type!r}") from None
    except (TypeError, ValueError, ArithmeticError) as e:
        if isinstance(e, LongboatError):  # already names what is wrong
            raise
        raise HFConversionError(f"{path}: malformed {adapter.model_type} config ({e})") from None


def read_hf_state_dict(hf_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors`` or of the shards ``model.safetensors.index.json`` names."""
    hf_dir = Path(hf_dir)
    if (hf_dir / WEIGHTS_INDEX).is_file():
        weight_map = _read_json(hf_dir / WEIGHTS_INDEX).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise HFConversionError(f"{hf_dir / WEIGHTS_INDEX}: no weight_map of tensor names to shard files")
        files = sorted(set(weight_map.values()))
    elif (hf_dir / SINGLE_WEIGHTS).is_file():
        files = [SINGLE_WEIGHTS]
    else:
        raise HFConversionError(f"{hf_dir}: no {SINGLE_WEIGHTS} or {WEIGHTS_INDEX}")
    state = {}
    for name in files:
        if not (hf_dir / name).is_file():
            raise HFConversionError(f"{hf_dir}: shard {name} named by {WEIGHTS_INDEX} is missing")
        try:
            with safe_open(str(hf_dir / name), framework="pt") as f:
                for key in f.keys():
                    state[key] = f.get_tensor(key)
        except (SafetensorError, OSError) as e:
            raise HFConversionError(f"{hf_dir / name}: not a readable safetensors file (truncated or corrupt: "
                                    f"{e})") from None
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
    """Build our model from an HF directory: ``(model, cfg, family)``; dtype preserved unless given."""
    from longboat.models import get_model

    adapter, cfg = hf_model_config(hf_dir)
    state = read_hf_weights(hf_dir, adapter, cfg)
    model = get_model(adapter.arch).build(cfg)
    model.load_state_dict(state, strict=True)
    target = resolve_dtype(dtype) or _stored_dtype(state)
    return model.to(target).eval(), cfg, adapter.model_type


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
    """The checkpoint's tensors under our names, checked against the model ``cfg`` describes (built on meta)."""
    from longboat.models import get_model

    model_cls = get_model(adapter.arch).module
    with torch.device("meta"):
        reference = model_cls(cfg).state_dict()
    state = read_hf_state_dict(hf_dir)
    check_hf_tensors(adapter, cfg, reference, state)
    return adapter.state_dict_from_hf(state, cfg)


def check_hf_tensors(adapter: HFAdapter, cfg, ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """Name every missing tensor, unexpected tensor and shape mismatch of an HF state dict against our model."""
    expected = {k: tuple(v.shape) for k, v in adapter.state_dict_to_hf(ours, cfg).items()}
    drop = [r"lm_head\.weight"] if getattr(cfg, "tie_embeddings", False) else []
    got = {k: tuple(v.shape) for k, v in theirs.items()
           if not any(re.fullmatch(p, k) for p in (*adapter.ignored_hf_tensors, *drop))}
    missing, unexpected = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing or unexpected:
        raise HFConversionError(
            f"{adapter.model_type} checkpoint does not match its config.json: "
            f"missing tensors {_short(missing)}, unexpected tensors {_short(unexpected)}"
        )
    wrong = [f"{k}: checkpoint {got[k]}, config.json implies {expected[k]}" for k in expected if got[k] != expected[k]]
    if wrong:
        raise HFConversionError(f"shape mismatch: {'; '.join(wrong[:5])}" + (" ..." if len(wrong) > 5 else ""))


def _short(names: list[str], limit: int = 8) -> str:
    return "[" + ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "") + "]"


def _stored_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    floats = [v.dtype for v in state.values() if v.is_floating_point()]
    return max(set(floats), key=floats.count) if floats else torch.float32


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
        data = _read_json(gen)
        return {k: data[k] for k in ("bos_token_id", "eos_token_id") if data.get(k) is not None}
    if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return {}
    from longboat.data.tokenizer import Tokenizer

    tok = Tokenizer(tokenizer_dir)
    return {k: v for k, v in (("bos_token_id", tok.bos_id), ("eos_token_id", tok.eos_id)) if v is not None}
