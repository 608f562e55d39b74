"""What a model config asks of memory, counted before anything is allocated, and the refusal of one that cannot fit.

The model is built on the meta device (every registered spec builds there), its parameters and buffers counted,
and their bytes compared with the memory available where it will live: ``MemAvailable`` (and the cgroup's limit)
for the CPU, the free memory of a CUDA device. The first meta build in a process imports torch's meta kernels
(about 2 CPU-seconds); later ones cost about 0.4 ms a module. A config whose build fails (a size that overflows),
runs past ``BUILD_SECONDS`` or makes more than ``MAX_MODULES`` modules is refused as well, in one line.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook

from longboat.config.base import ConfigError, StrictModel
from longboat.errors import LongboatError, WorldError
from longboat.utils.deadline import time_limit

MAX_MODULES = 50_000  # far above any real model's (a 100-layer decoder has about 1,200); a meta build of this
# many takes about 20 s, the cost of refusing a config with a billion layers
BUILD_SECONDS = 120.0


class ModelTooLargeError(WorldError):
    """A model config needs more memory than the machine has."""


@dataclass(frozen=True)
class Footprint:
    parameters: int
    nbytes: int  # parameters and buffers


def footprint(spec, cfg: StrictModel, source: str | Path) -> Footprint:
    """The parameters and bytes of ``spec.build(cfg)``, built on the meta device: nothing is allocated."""
    with torch.device("meta"), _module_limit(source), time_limit(BUILD_SECONDS, lambda: ConfigError(
            f"{source}: building the model config took more than {BUILD_SECONDS:g} s; is a size in it absurd?")):
        try:
            model = spec.build(cfg)
        except LongboatError:
            raise
        except Exception as e:  # a size that overflows, a dimension torch refuses, ...
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ConfigError(f"{source}: the model config cannot be built: {type(e).__name__}: {reason}") from None
    return measure(model)


def measure(model: nn.Module) -> Footprint:
    params = list(model.parameters())
    tensors = params + list(model.buffers())
    return Footprint(sum(p.numel() for p in params), sum(t.numel() * t.element_size() for t in tensors))


@contextmanager
def _module_limit(source: str | Path) -> Iterator[None]:
    """Refuse a build (in this thread) that registers more than ``MAX_MODULES`` modules."""
    thread, count = threading.get_ident(), 0

    def counted(module, name, submodule):
        nonlocal count
        if threading.get_ident() == thread:
            count += 1
            if count > MAX_MODULES:
                raise ConfigError(f"{source}: the model config makes more than {MAX_MODULES:,} modules; is a count "
                                  "in it (layers, experts) absurd?")

    handle = register_module_module_registration_hook(counted)
    try:
        yield
    finally:
        handle.remove()


def available_memory(device: str | torch.device = "cpu") -> int | None:
    """Bytes that can be allocated on ``device`` now; None when it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    if device.type != "cpu":
        return None
    amounts = [a for a in (_meminfo_available(), _cgroup_available()) if a is not None]
    return min(amounts) if amounts else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> int | None:
    """What the process's cgroup (v2) still allows, when it has a limit."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int((root / "memory.current").read_text()), 0)
    except (OSError, ValueError):
        return None


def check_fits(found: Footprint, source: str | Path, device: str | torch.device = "cpu") -> Footprint:
    """``found``, or a ``ModelTooLargeError`` when its bytes exceed the memory available on ``device``."""
    available = available_memory(device)
    if available is not None and found.nbytes > available:
        raise ModelTooLargeError(f"{source}: the model has {found.parameters:,} parameters ({_gib(found.nbytes)} "
                                 f"with its buffers), more than the {_gib(available)} of memory available on "
                                 f"{torch.device(device)}")
    return found


def check_config_fits(spec, cfg: StrictModel, source: str | Path, device: str | torch.device = "cpu") -> Footprint:
    """Count ``cfg``'s model on the meta device and refuse it when it cannot fit on ``device``."""
    return check_fits(footprint(spec, cfg, source), source, device)


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"
