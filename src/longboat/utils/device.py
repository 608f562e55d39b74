"""Devices through ``torch.accelerator``: CUDA, XPU, MPS and the CPU alike, never one backend by name."""

from __future__ import annotations

import ctypes
import resource

import torch

from longboat.config.base import ConfigError


def accelerator_type() -> str | None:
    """``cuda``, ``xpu``, ``mps``, ... when this machine has an accelerator, else None."""
    if not torch.accelerator.is_available():
        return None
    return torch.accelerator.current_accelerator().type


def resolve_device(choice: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto``: this process's accelerator (one per local rank), else the CPU; ``cpu``; or an accelerator type."""
    acc = accelerator_type()
    if choice == "cpu" or (choice == "auto" and acc is None):
        return torch.device("cpu")
    if choice != "auto" and choice != acc:
        raise ConfigError(f"train.device={choice}, but this machine's accelerator is {acc or 'none'}; "
                          f"use train.device=auto or cpu")
    count = torch.accelerator.device_count()
    if local_rank >= count:
        raise ConfigError(f"LOCAL_RANK {local_rank}, but this node has {count} {acc} devices; start at most one "
                          "process per device (torchrun --nproc_per_node)")
    return torch.device(acc, local_rank)


def use_device(device: torch.device) -> None:
    """Make ``device`` the current accelerator of this process (collectives and caches use it)."""
    if device.type != "cpu":
        torch.accelerator.set_device_index(device.index or 0)


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated memory: the accelerator's own counter, or the process's peak resident size on CPU."""
    if device.type != "cpu":
        try:
            return torch.accelerator.max_memory_allocated(device) / 2**20
        except (RuntimeError, NotImplementedError):  # a backend without memory statistics
            pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def set_threads(threads: int | None) -> None:
    """CPU threads for torch's intra-op pool (None: torch's default)."""
    if threads:
        torch.set_num_threads(threads)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def keep_freed_cpu_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse instead of handing it back to the OS.

    By default glibc maps every block of 32 MiB or more (a layer's activations, its gradients) on its own and unmaps
    it when freed, so each step maps it again and the kernel zero-fills each page on first touch. Kept in the heap,
    the next step reuses the blocks: faster steps on CPU, a higher peak resident size. Returns whether it applied
    (False where the C library is not glibc)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: other C libraries read these parameters differently or not at all
    except (OSError, AttributeError):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
