"""What produced a run or an export: versions, git revision, host. Written beside every artefact."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import time
from pathlib import Path

import longboat

CONFIG_FORMAT_VERSION = 1
CHECKPOINT_FORMAT_VERSION = 1

_PACKAGES = ("torch", "numpy", "tokenizers", "safetensors", "pydantic", "transformers", "megatron-core")


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(longboat.__file__).parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def provenance() -> dict:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "longboat": longboat.__version__,
        "git_revision": git_revision(),
        "python": platform.python_version(),
        "packages": versions,
        "config_format_version": CONFIG_FORMAT_VERSION,
        "checkpoint_format_version": CHECKPOINT_FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
