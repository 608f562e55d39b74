"""Exports for sharing and serving: safetensors weights + JSON config + the task's assets. Never a pickle.

``longboat_config.json`` records the architecture and its config, the task, the plugins that register them,
the asset files beside it (tokenizer files, normalisation statistics, ...) and whether the weights are an EMA.
Format 1 (no task, assets or plugins; tokenizer files only) is still read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_file, save_model

from longboat.config.base import ConfigError
from longboat.errors import LongboatError
from longboat.utils.outputs import staged_output
from longboat.utils.provenance import provenance

EXPORT_CONFIG = "longboat_config.json"
WEIGHTS = "model.safetensors"
EXPORT_FORMAT_VERSION = 2
_READABLE_VERSIONS = (1, EXPORT_FORMAT_VERSION)


class ExportError(LongboatError, ValueError):
    """An export directory is missing a file or does not describe a known model."""


def find_export(path: str | os.PathLike) -> Path:
    """The export that ``path`` names: itself, or a run directory's ``export/``."""
    path = Path(path)
    for candidate in (path, path / "export"):
        if (candidate / EXPORT_CONFIG).is_file():
            return candidate
    raise ConfigError(f"{path}: not a policy export nor a run directory with one; a checkpoint is served after "
                      f"`longboat export RUN_DIR --output DIR`")


def save_export(
    out_dir: str | os.PathLike,
    model: torch.nn.Module | dict[str, torch.Tensor],
    arch: str,
    model_config: dict,
    assets: dict[str, Path | bytes] | None = None,
    extra: dict | None = None,
    *,
    overwrite: bool | None = None,
    sources: Sequence[str | os.PathLike] = (),
) -> Path:
    """Write an export atomically: a hidden sibling of ``out_dir`` filled, then renamed into place.

    ``model`` is a module or its full state dict (e.g. gathered from FSDP shards by ``get_model_state_dict``).
    ``assets`` maps file names to a file to copy or the bytes to write beside the weights. An existing
    ``out_dir`` is replaced only as ``overwrite`` allows (``None``: only a run's own export directory, which
    training rewrites), and never when it is, holds or lies inside ``sources``, a run or a checkpoint
    (see ``longboat.utils.outputs``).
    """
    for name in assets or {}:
        if Path(name).name != name or name in (EXPORT_CONFIG, WEIGHTS):
            raise ExportError(f"export asset name {name!r} must be a plain file name other than {EXPORT_CONFIG}")
    with staged_output(out_dir, overwrite, sources) as tmp:
        if isinstance(model, torch.nn.Module):
            save_model(model, str(tmp / WEIGHTS), metadata={"format": "pt"})
        else:
            save_file({k: v.contiguous() for k, v in model.items()}, str(tmp / WEIGHTS), metadata={"format": "pt"})
        meta = {
            "format_version": EXPORT_FORMAT_VERSION,
            "arch": arch,
            "model": model_config,
            "assets": sorted(assets or {}),
            "provenance": provenance(),
            **(extra or {}),
        }
        (tmp / EXPORT_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
        for name, content in (assets or {}).items():
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                shutil.copy2(content, tmp / name)
    return Path(out_dir)


def read_export_config(export_dir: str | os.PathLike) -> dict:
    path = Path(export_dir) / EXPORT_CONFIG
    if not path.is_file():
        raise ExportError(f"{export_dir}: not a longboat export (no {EXPORT_CONFIG})")
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format_version") not in _READABLE_VERSIONS:
        version = meta.get("format_version") if isinstance(meta, dict) else None
        raise ExportError(f"{path}: export format {version} is not one this longboat reads "
                          f"({', '.join(map(str, _READABLE_VERSIONS))})")
    if meta["format_version"] == 1:  # tokenizer files were its only assets
        names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        meta = {**meta, "task": None, "assets": [n for n in names if (Path(export_dir) / n).is_file()]}
    return meta


def load_export_weights(export_dir: str | os.PathLike, model: torch.nn.Module) -> None:
    weights = Path(export_dir) / WEIGHTS
    if not weights.is_file():
        raise ExportError(f"{export_dir}: no {WEIGHTS}")
    try:
        missing, unexpected = load_model(model, str(weights), strict=False)
    except (SafetensorError, OSError) as e:  # truncated or not safetensors at all
        raise ExportError(f"{weights}: not a readable safetensors file ({e})") from None
    except RuntimeError as e:  # a tensor whose shape the config does not give
        raise ExportError(f"{weights}: does not match {EXPORT_CONFIG} ({str(e).splitlines()[0]})") from None
    if missing or unexpected:
        raise ExportError(f"{weights}: missing tensors {sorted(missing)}, unexpected tensors {sorted(unexpected)}")
