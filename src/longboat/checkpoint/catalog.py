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
from longboat.checkpoint.integrity import COMPLETE_MARKER, checkpoint_problem
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
