"""Resumable checkpoints with torch.distributed.checkpoint: sharded, reshardable, written atomically.

A checkpoint is ``<dir>/step_<N>/`` holding the DCP files (model, optimizer, scheduler, trainer and data
position) and one ``rng_rank<R>.pt`` per rank. It is written under ``step_<N>.tmp`` and renamed when
complete, so a crash mid-write leaves nothing that ``latest()`` would pick. DCP metadata is pickled: these
directories are trusted local files for resuming; anything shared goes through ``export``.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from longboat.errors import LongboatError
from longboat.utils.seeding import rng_state, set_rng_state

# DCP warns on every single-process save/load; a single process is a supported, intended case here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

_STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE_MARKER = "COMPLETE"
# Test-only fault injection: SIGKILL this process after the DCP files of this step are written but before
# the checkpoint is complete, to prove that an interrupted save is never resumed from.
FAULT_ENV = "LONGBOAT_FAULT_KILL_DURING_SAVE"


class CheckpointError(LongboatError, RuntimeError):
    """A checkpoint is missing, incomplete or does not match the run."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class ModelOptimizerState(Stateful):
    """Model and optimizer state through DCP's state-dict API, so FSDP/TP shards save and reshard."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"])
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class CheckpointManager:
    """Saves, finds and loads the checkpoints of one run directory, keeping the newest ``keep``."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3):
        self.dir = Path(directory)
        self.keep = keep

    def complete_checkpoints(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        found = []
        for p in self.dir.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and (p / COMPLETE_MARKER).is_file():
                found.append((int(m.group(1)), p))
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        done = self.complete_checkpoints()
        return done[-1] if done else None

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write ``state`` (Stateful objects and plain values) as checkpoint ``step``; every rank calls this."""
        final = self.dir / f"step_{step:08d}"
        tmp = self.dir / f"step_{step:08d}.tmp"
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        dcp.save(state, checkpoint_id=tmp)
        torch.save(rng_state(), tmp / f"rng_rank{_rank()}.pt")
        if os.environ.get(FAULT_ENV) == str(step):
            os.kill(os.getpid(), 9)
        _barrier()
        if _rank() == 0:
            (tmp / COMPLETE_MARKER).write_text(f"{step}\n")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            self._prune()
        _barrier()
        return final

    def load(self, path: str | os.PathLike, state: dict[str, Any], restore_rng: bool = True) -> None:
        """Load ``path`` into ``state`` in place (Stateful objects are updated; plain values replaced)."""
        path = Path(path)
        if not (path / COMPLETE_MARKER).is_file():
            raise CheckpointError(f"{path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)")
        dcp.load(state, checkpoint_id=path)
        rng_file = path / f"rng_rank{_rank()}.pt"
        if restore_rng and rng_file.is_file():
            set_rng_state(torch.load(rng_file, weights_only=True))

    def _prune(self) -> None:
        for p in self.dir.glob("step_*.tmp"):
            shutil.rmtree(p, ignore_errors=True)
        done = self.complete_checkpoints()
        for old in done[: max(len(done) - self.keep, 0)]:
            shutil.rmtree(old, ignore_errors=True)


def load_model_weights(path: str | os.PathLike, model: torch.nn.Module) -> None:
    """Load only the model weights of a checkpoint (e.g. to generate from it or export it)."""
    path = Path(path)
    if not (path / COMPLETE_MARKER).is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    state = {"train": ModelOptimizerState(model, None)}
    dcp.load(state, checkpoint_id=path)


__all__ = ["CheckpointManager", "CheckpointError", "ModelOptimizerState", "load_model_weights"]
