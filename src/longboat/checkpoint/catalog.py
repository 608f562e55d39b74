"""The checkpoints a run directory holds: the complete ones in step order, and the newest intact one.

Plain file-system reads, without torch.distributed.checkpoint: ``longboat train --check`` and opening a run
look for a checkpoint before (or without) loading one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rich.markup import escape

from longboat.checkpoint.errors import CheckpointError
from longboat.checkpoint.integrity import COMPLETE_MARKER, MANIFEST, checkpoint_problem, has_checksums, read_manifest
from longboat.utils.logging import console

_STEP_DIR = re.compile(r"^step_(\d+)$")


def complete_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """``step_N`` directories marked complete, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / COMPLETE_MARKER).is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint whose files are as its manifest records.

    A damaged one is passed over with a warning naming it; when every complete checkpoint is damaged, an error
    (resuming from nothing would silently restart the run).
    """
    done = complete_checkpoints(directory)
    for path in reversed(done):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        console.print(escape(f"warning: checkpoint {path} is damaged ({problem}); falling back to the "
                             "previous complete checkpoint"), style="yellow")
    if done:
        raise CheckpointError(f"{done[-1]}: damaged checkpoint: {checkpoint_problem(done[-1])}; "
                              f"no complete checkpoint in {directory} is intact")
    return None


def checkpoints_at(path: str | os.PathLike) -> list[Path]:
    """The checkpoints ``path`` names: itself when it is one, else the complete ones of a run directory (or of its
    ``checkpoints/`` directory), oldest first."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such directory")
    if any((path / name).is_file() for name in (COMPLETE_MARKER, MANIFEST, ".metadata")):
        return [path]
    found = complete_checkpoints(path / "checkpoints") or complete_checkpoints(path)
    if not found:
        raise CheckpointError(f"{path}: neither a checkpoint nor a run directory holding a complete checkpoint")
    return found


def verify_report(path: Path) -> tuple[str | None, str]:
    """(the first problem of checkpoint ``path`` or None, what was checked)."""
    if not (path / COMPLETE_MARKER).is_file():
        return f"not a complete checkpoint (no {COMPLETE_MARKER} marker)", ""
    problem = checkpoint_problem(path)
    try:
        manifest = read_manifest(path)
    except CheckpointError:
        manifest = None
    if manifest is None or not isinstance(manifest.get("files"), dict):
        return problem, "no file list (format 1), DCP files present"
    n = len(manifest["files"])
    if has_checksums(path):
        return problem, f"{n} files, sizes and checksums"
    return problem, f"{n} files, sizes only (written before checksums were recorded)"
