"""Resumable checkpoints with torch.distributed.checkpoint: sharded, reshardable, written atomically.

A checkpoint is ``<dir>/step_<N>/`` holding the DCP files (model, optimizer, scheduler, trainer and data
position, and when present the EMA weights), the task's state as ``task_state.safetensors`` (small tensors such
as normalisation statistics, readable without knowing their shapes), one ``rng_rank<R>.pt`` per rank and
``checkpoint.json`` (format version, the top-level keys saved and every file with its size and CRC-32; format 1 had no
such file and saved ``train``, ``scheduler`` and ``trainer`` only). It is written under ``step_<N>.tmp`` and
renamed when complete, so a crash mid-write leaves nothing that ``latest()`` would pick, and a checkpoint
damaged later is found from its manifest and passed over. DCP pickles its metadata and non-tensor values;
``safe_dcp`` reads both without running code. These directories are for resuming one's own runs; anything
shared goes through ``export``.
"""

from __future__ import annotations

import json
import os
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

from safetensors.torch import load_file, save

from longboat.checkpoint.catalog import complete_checkpoints, latest_checkpoint
from longboat.checkpoint.errors import CheckpointError
from longboat.checkpoint.integrity import (
    COMPLETE_MARKER,
    MANIFEST,
    ChecksumStream,
    file_sizes,
    read_manifest,
    remember_checksum,
    verify_checkpoint,
)
from longboat.checkpoint.safe_dcp import load_dcp
from longboat.checkpoint.writer import ChecksummingWriter
from longboat.utils.seeding import rng_state, set_rng_state

# DCP warns on every single-process save/load; a single process is a supported, intended case here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

TASK_STATE = "task_state.safetensors"
CHECKPOINT_FORMAT_VERSION = 2
_FORMAT_1_CONTENTS = ("train", "scheduler", "trainer")
# Test-only fault injection: SIGKILL this process after the DCP files of this step are written but before
# the checkpoint is complete, to prove that an interrupted save is never resumed from.
FAULT_ENV = "LONGBOAT_FAULT_KILL_DURING_SAVE"


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
        return complete_checkpoints(self.dir)

    def latest(self) -> Path | None:
        """The newest intact complete checkpoint (``catalog.latest_checkpoint``)."""
        return latest_checkpoint(self.dir)

    def save(self, step: int, state: dict[str, Any], task_state: dict[str, torch.Tensor] | None = None) -> Path:
        """Write ``state`` (Stateful objects and plain values) as checkpoint ``step``; every rank calls this.

        ``task_state`` (the same on every rank) is written by rank 0 beside the DCP files.
        """
        final = self.dir / f"step_{step:08d}"
        tmp = self.dir / f"step_{step:08d}.tmp"
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        writer = ChecksummingWriter(tmp)
        dcp.save(state, checkpoint_id=tmp, storage_writer=writer)
        checksums = writer.checksums
        checksums[f"rng_rank{_rank()}.pt"] = _write_checksummed(tmp / f"rng_rank{_rank()}.pt",
                                                                lambda f: torch.save(rng_state(), f))
        if os.environ.get(FAULT_ENV) == str(step):
            os.kill(os.getpid(), 9)
        checksums = _gather_checksums(checksums)  # every rank's, on every rank (also a barrier)
        if _rank() == 0:
            contents = sorted(state)
            if task_state:
                data = save({k: v.detach().cpu().contiguous() for k, v in task_state.items()})
                checksums[TASK_STATE] = _write_checksummed(tmp / TASK_STATE, lambda f: f.write(data))
                contents.append("task")
            # All ranks' files are on the shared filesystem after the barrier: list them before marking complete.
            sizes = file_sizes(tmp)
            missing = sorted(set(sizes) - set(checksums))
            if missing:  # a file written outside the checksumming streams: a change in DCP's writer
                raise CheckpointError(f"{tmp}: no checksum was computed for {', '.join(missing)}")
            manifest = {"format_version": CHECKPOINT_FORMAT_VERSION, "step": step, "contents": contents,
                        "files": sizes, "checksums": {name: checksums[name] for name in sizes}}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            (tmp / COMPLETE_MARKER).write_text(f"{step}\n")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            self._prune()
        _barrier()
        _remember(final, checksums)
        return final

    @staticmethod
    def contents(path: str | os.PathLike) -> list[str]:
        """The top-level keys a complete checkpoint holds."""
        return checkpoint_contents(path)

    def load(self, path: str | os.PathLike, state: dict[str, Any], restore_rng: bool = True) -> None:
        """Load ``path`` into ``state`` in place (Stateful objects are updated; plain values replaced)."""
        path = _verified(path)
        load_dcp(state, path)
        rng_file = path / f"rng_rank{_rank()}.pt"
        if restore_rng and rng_file.is_file():
            try:
                rng = torch.load(rng_file, weights_only=True)
            except Exception as e:
                raise CheckpointError(f"{rng_file}: unreadable ({type(e).__name__}: {str(e).strip()[:200]})") from None
            set_rng_state(rng)

    def _prune(self) -> None:
        for p in self.dir.glob("step_*.tmp"):
            shutil.rmtree(p, ignore_errors=True)
        done = self.complete_checkpoints()
        for old in done[: max(len(done) - self.keep, 0)]:
            shutil.rmtree(old, ignore_errors=True)


def _write_checksummed(file: Path, write) -> str:
    """Call ``write`` on ``file`` opened for writing; return the checksum of the bytes it wrote."""
    with open(file, "wb") as raw:
        stream = ChecksumStream(raw)
        write(stream)
    return stream.checksum


def _gather_checksums(local: dict[str, str]) -> dict[str, str]:
    """The checksums of the files every rank wrote (a collective: every rank calls it)."""
    if not dist.is_initialized():
        return dict(local)
    gathered: list[dict[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return {name: checksum for part in gathered for name, checksum in (part or {}).items()}


def _remember(path: Path, checksums: dict[str, str]) -> None:
    """Spare this process reading back the checkpoint it just wrote to verify it (``latest()`` at the end of a run)."""
    for name, checksum in checksums.items():
        if (path / name).is_file():
            remember_checksum(path / name, checksum)


def _verified(path: str | os.PathLike) -> Path:
    """``path`` once it is known to be a complete checkpoint with every file as recorded."""
    path = Path(path)
    if not (path / COMPLETE_MARKER).is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    verify_checkpoint(path)
    return path


def checkpoint_contents(path: str | os.PathLike) -> list[str]:
    """The top-level keys of a checkpoint: from its manifest, or format 1's fixed set."""
    meta = read_manifest(path)
    if meta is None:
        return list(_FORMAT_1_CONTENTS)
    if meta.get("format_version") not in (1, CHECKPOINT_FORMAT_VERSION):
        raise CheckpointError(f"{Path(path) / MANIFEST}: checkpoint format {meta.get('format_version')} is newer "
                              f"than this longboat reads ({CHECKPOINT_FORMAT_VERSION}); upgrade longboat")
    return list(meta["contents"])


def load_task_state(path: str | os.PathLike) -> dict[str, torch.Tensor] | None:
    """The task's saved state, or None when the checkpoint holds none."""
    file = Path(path) / TASK_STATE
    if not file.is_file():
        return None
    try:
        return load_file(str(file))
    except Exception as e:  # safetensors raises its own error type for damaged files
        raise CheckpointError(f"{file}: unreadable ({type(e).__name__}: {e})") from None


def load_model_weights(path: str | os.PathLike, model: torch.nn.Module, ema: bool = False) -> bool:
    """Load the model weights of a checkpoint (e.g. to generate from it or export it).

    With ``ema``, the EMA weights when the checkpoint has them; returns whether they were loaded.
    """
    path = _verified(path)
    load_dcp({"train": ModelOptimizerState(model, None)}, path)
    if not (ema and "ema" in checkpoint_contents(path)):
        return False
    # The average covers the trainable weights; frozen ones keep the values just loaded.
    weights = model.state_dict()
    load_dcp({"ema": weights}, path, allow_partial_load=True)
    model.load_state_dict(weights)
    return True


__all__ = ["COMPLETE_MARKER", "CheckpointManager", "CheckpointError", "ModelOptimizerState", "checkpoint_contents",
           "load_model_weights", "load_task_state"]
