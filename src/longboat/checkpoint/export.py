"""Exports for sharing and serving: safetensors weights + JSON config (+ tokenizer). Never a pickle."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_file, save_model

from longboat.errors import LongboatError
from longboat.utils.provenance import provenance

EXPORT_CONFIG = "longboat_config.json"
WEIGHTS = "model.safetensors"
EXPORT_FORMAT_VERSION = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class ExportError(LongboatError, ValueError):
    """An export directory is missing a file or does not describe a known model."""


def save_export(
    out_dir: str | os.PathLike,
    model: torch.nn.Module | dict[str, torch.Tensor],
    arch: str,
    model_config: dict,
    tokenizer_dir: str | os.PathLike | None = None,
    extra: dict | None = None,
) -> Path:
    """Write an export atomically: ``<out>.tmp`` filled, then renamed to ``out``.

    ``model`` is a module or its full state dict (e.g. gathered from FSDP shards by ``get_model_state_dict``).
    """
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if isinstance(model, torch.nn.Module):
        save_model(model, str(tmp / WEIGHTS), metadata={"format": "pt"})
    else:
        save_file({k: v.contiguous() for k, v in model.items()}, str(tmp / WEIGHTS), metadata={"format": "pt"})
    meta = {
        "format_version": EXPORT_FORMAT_VERSION,
        "arch": arch,
        "model": model_config,
        "provenance": provenance(),
        **(extra or {}),
    }
    (tmp / EXPORT_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.is_file():
                shutil.copy2(src, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def read_export_config(export_dir: str | os.PathLike) -> dict:
    path = Path(export_dir) / EXPORT_CONFIG
    if not path.is_file():
        raise ExportError(f"{export_dir}: not a longboat export (no {EXPORT_CONFIG})")
    meta = json.loads(path.read_text())
    if meta.get("format_version") != EXPORT_FORMAT_VERSION:
        raise ExportError(f"{path}: export format {meta.get('format_version')} (expected {EXPORT_FORMAT_VERSION})")
    return meta


def load_export_weights(export_dir: str | os.PathLike, model: torch.nn.Module) -> None:
    weights = Path(export_dir) / WEIGHTS
    if not weights.is_file():
        raise ExportError(f"{export_dir}: no {WEIGHTS}")
    missing, unexpected = load_model(model, str(weights), strict=False)
    if missing or unexpected:
        raise ExportError(f"{weights}: missing tensors {sorted(missing)}, unexpected tensors {sorted(unexpected)}")
