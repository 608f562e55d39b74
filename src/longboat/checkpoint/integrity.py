"""What a checkpoint directory holds, recorded before it is marked complete, and checked before it is read.

The manifest lists every file with its size. A file lost or cut short afterwards (a full disk, a copy
interrupted, a filesystem error) is found by comparing the directory with that list, before DCP is asked to
read it. Checkpoints written without the list (format 1, and format 2 before it) can only be checked for DCP's
``.metadata`` and at least one ``.distcp`` data file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from longboat.checkpoint.errors import CheckpointError

MANIFEST = "checkpoint.json"
COMPLETE_MARKER = "COMPLETE"
# Written after the list is taken, so not in it.
_UNLISTED = frozenset({MANIFEST, COMPLETE_MARKER})


def file_sizes(directory: str | os.PathLike) -> dict[str, int]:
    """Every file under ``directory`` (relative POSIX path) and its size in bytes, except the manifest and marker."""
    root = Path(directory)
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).as_posix() not in _UNLISTED}


def read_manifest(path: str | os.PathLike) -> dict | None:
    """The manifest of checkpoint ``path``, or None when it has none (format 1)."""
    file = Path(path) / MANIFEST
    if not file.is_file():
        return None
    try:
        manifest = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file}: unreadable ({e})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return manifest


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """The first thing wrong with the files of checkpoint ``path``, or None when they are as recorded."""
    path = Path(path)
    try:
        manifest = read_manifest(path)
    except CheckpointError as e:
        return str(e)
    files = manifest.get("files") if manifest else None
    if not isinstance(files, dict):
        if not (path / ".metadata").is_file():
            return "missing file .metadata"
        if not any(path.glob("*.distcp")):
            return "no .distcp data file"
        return None
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            return f"missing file {name}"
        actual = file.stat().st_size
        if actual != size:
            return f"{name} is {actual} bytes, the manifest records {size}"
    return None


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Raise ``CheckpointError`` naming checkpoint ``path`` and its first problem, if it has one."""
    problem = checkpoint_problem(path)
    if problem is not None:
        raise CheckpointError(f"{path}: damaged checkpoint: {problem}")


__all__ = ["COMPLETE_MARKER", "MANIFEST", "checkpoint_problem", "file_sizes", "read_manifest", "verify_checkpoint"]
