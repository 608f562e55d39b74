"""An HF checkpoint's weights read one shard file at a time, each tensor converted to ours once it is complete.

Most of our tensors are one HF tensor renamed; some are made of several (a layer's experts stacked into one), and
those are buffered only until their last part has been read. Which HF tensors make each of ours is the adapter's
own export mapping applied to that tensor alone, so every family streams without code of its own. Shapes are
checked against the model's config from the files' headers before any tensor is read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from longboat.models.llm.hf.adapter import HFAdapter, HFConversionError
from longboat.utils.json_files import read_json_object

SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def read_json(path: Path) -> dict:
    """A JSON object from ``path``; an error naming the file when it is unreadable or not an object."""
    return read_json_object(path, HFConversionError)


def shard_files(hf_dir: str | os.PathLike) -> list[Path]:
    """``model.safetensors``, or the shards ``model.safetensors.index.json`` names, each checked to exist."""
    hf_dir = Path(hf_dir)
    if (hf_dir / WEIGHTS_INDEX).is_file():
        weight_map = read_json(hf_dir / WEIGHTS_INDEX).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise HFConversionError(f"{hf_dir / WEIGHTS_INDEX}: no weight_map of tensor names to shard files")
        names = sorted(set(weight_map.values()))
    elif (hf_dir / SINGLE_WEIGHTS).is_file():
        names = [SINGLE_WEIGHTS]
    else:
        raise HFConversionError(f"{hf_dir}: no {SINGLE_WEIGHTS} or {WEIGHTS_INDEX}")
    missing = [n for n in names if not (hf_dir / n).is_file()]
    if missing:
        raise HFConversionError(f"{hf_dir}: shard {missing[0]} named by {WEIGHTS_INDEX} is missing")
    return [hf_dir / n for n in names]


def open_shard(path: Path):
    """``safe_open`` with an unreadable file named (also raise ``shard_error`` for failures while reading)."""
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as e:
        raise shard_error(path, e) from None


def shard_error(path: Path, e: Exception) -> HFConversionError:
    return HFConversionError(f"{path}: not a readable safetensors file (truncated or corrupt: {e})")


def check_hf_tensors(adapter: HFAdapter, cfg, ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """Name every missing tensor, unexpected tensor and shape mismatch of an HF state dict against our model."""
    expected = {k: tuple(v.shape) for k, v in adapter.state_dict_to_hf(ours, cfg).items()}
    got = {k: tuple(v.shape) for k, v in theirs.items() if not _dropped(adapter, cfg, k)}
    missing, unexpected = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing or unexpected:
        raise HFConversionError(
            f"{adapter.model_type} checkpoint does not match its config.json: "
            f"missing tensors {_short(missing)}, unexpected tensors {_short(unexpected)}"
        )
    wrong = [f"{k}: checkpoint {got[k]}, config.json implies {expected[k]}" for k in expected
             if not adapter.shape_matches(k, got[k], expected[k])]
    if wrong:
        raise HFConversionError(f"shape mismatch: {'; '.join(wrong[:5])}" + (" ..." if len(wrong) > 5 else ""))


def _dropped(adapter: HFAdapter, cfg, name: str) -> bool:
    """Derived buffers some checkpoints carry, and the head of a tied model (it reads the embedding table)."""
    drop = [r"lm_head\.weight"] if getattr(cfg, "tie_embeddings", False) else []
    return any(re.fullmatch(p, name) for p in (*adapter.ignored_hf_tensors, *drop))


def _short(names: list[str], limit: int = 8) -> str:
    return "[" + ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "") + "]"


class HFWeights:
    """The weights of an HF directory for our model of config ``cfg``, checked on construction (headers only)."""

    def __init__(self, hf_dir: str | os.PathLike, adapter: HFAdapter, cfg):
        from longboat.models import get_model

        self.adapter, self.cfg = adapter, cfg
        self.files = shard_files(hf_dir)
        self.headers: dict[str, torch.Tensor] = {}  # HF name -> a meta tensor of its shape and dtype
        for path in self.files:
            with open_shard(path) as f:
                for name in f.keys():
                    view = f.get_slice(name)
                    if view.get_dtype() not in _DTYPES:  # e.g. FP8 block-quantised weights
                        raise HFConversionError(f"{path}: tensor {name} has dtype {view.get_dtype()}, which longboat "
                                                f"does not import (known: {', '.join(_DTYPES)})")
                    self.headers[name] = torch.empty(view.get_shape(), dtype=_DTYPES[view.get_dtype()], device="meta")
        with torch.device("meta"):
            reference = get_model(adapter.arch).module(cfg).state_dict()
        check_hf_tensors(adapter, cfg, reference, self.headers)
        # Our tensor -> the HF tensors it is made of, and back.
        self.parts = {ours: set(adapter.state_dict_to_hf({ours: t}, cfg)) for ours, t in reference.items()}
        self.users: dict[str, list[str]] = {}
        for ours, names in self.parts.items():
            for name in names:
                self.users.setdefault(name, []).append(ours)

    @property
    def stored_dtype(self) -> torch.dtype:
        """The most common floating dtype in the files: what an import keeps unless told otherwise."""
        floats = [t.dtype for t in self.headers.values() if t.is_floating_point()]
        return max(set(floats), key=floats.count) if floats else torch.float32

    def groups(self, dtype: torch.dtype | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """Our tensors, one dict per shard file: those its reading completed, floating ones cast to ``dtype``
        (None: as stored). Every HF tensor is read once; only parts of tensors not yet complete stay buffered."""
        waiting = {ours: set(names) for ours, names in self.parts.items()}
        pending: dict[str, dict[str, torch.Tensor]] = {}
        for path in self.files:
            ready = {}
            with open_shard(path) as f:
                for name in f.keys():
                    if name not in self.users:
                        continue  # dropped (see ``_dropped``); the check allowed nothing else
                    try:
                        value = f.get_tensor(name)
                    except (SafetensorError, OSError) as e:
                        raise shard_error(path, e) from None
                    for ours in self.users[name]:
                        pending.setdefault(ours, {})[name] = value
                        waiting[ours].discard(name)
                        if not waiting[ours]:
                            ready[ours] = self._convert(ours, pending.pop(ours), dtype)
                    del value
            if ready:
                yield ready

    def _convert(self, ours: str, parts: dict[str, torch.Tensor], dtype: torch.dtype | None) -> torch.Tensor:
        value = self.adapter.state_dict_from_hf(parts, self.cfg)[ours]
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        return value.contiguous()
