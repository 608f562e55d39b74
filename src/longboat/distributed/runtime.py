"""The process group of a ``torchrun`` launch, or a single process when there is none."""

from __future__ import annotations

import os
from datetime import timedelta
from dataclasses import dataclass

import torch
import torch.distributed as dist

from longboat.config.base import ConfigError
from longboat.utils.device import resolve_device, use_device


@dataclass(frozen=True)
class Runtime:
    """This process's place in the job; ``backend`` is None for a plain single-process run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def launched_world_size() -> int | None:
    """The world size torchrun set, or None outside torchrun."""
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value else None


def _backend(choice: str, device: torch.device) -> str:
    """gloo on CPU; on an accelerator its own collective library (NCCL, XCCL, ...) beside gloo, which serves the
    few collectives on CPU tensors (stop flags, checkpoint metadata)."""
    accel = dist.get_default_backend_for_device(device) if device.type != "cpu" else "gloo"
    if choice == "nccl" and accel != "nccl":
        raise ConfigError("parallel.backend=nccl needs CUDA devices; use parallel.backend=gloo (or auto) on CPU")
    if choice == "gloo" or device.type == "cpu":
        return "gloo"
    return f"{device.type}:{accel},cpu:gloo"


def init_runtime(backend: str = "auto", device: str = "auto", timeout_minutes: float = 10.0) -> Runtime:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).

    Outside torchrun (WORLD_SIZE unset) nothing is initialised and the runtime is a single process.
    """
    world = launched_world_size()
    if world is None:
        dev = resolve_device(device, 0)
        use_device(dev)
        return Runtime(device=dev)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    be = _backend(backend, dev)
    use_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(be, rank=rank, world_size=world, device_id=dev if dev.type != "cpu" else None,
                                timeout=timedelta(minutes=timeout_minutes))
    return Runtime(rank, world, local_rank, dev, be)


def shutdown(runtime: Runtime) -> None:
    """Leave the process group (a no-op for a single process)."""
    if runtime.distributed and dist.is_initialized():
        dist.destroy_process_group()
