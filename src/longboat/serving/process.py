"""The serving process: the device and CPU threads a policy is served with, and the server run in the foreground
with its logging."""

from __future__ import annotations

import logging
import sys

import torch

from longboat.config.base import ConfigError
from longboat.serving.served import ServedPolicy
from longboat.serving.server import PolicyServer, ServerConfig


def resolve_device(name: str | None) -> torch.device:
    """``--device`` as a torch device this machine has (default: cuda when available, else cpu); a name torch does
    not know or a device that is not here is refused before the policy is loaded."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ConfigError(f"--device {name}: not a device to serve on (expected cpu, cuda, cuda:N or mps)")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"--device {name}: this machine has no CUDA device; use --device cpu")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"--device {name}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as e:  # torch says "not compiled with" by an AssertionError
        why = str(e).splitlines()[0].split(". ")[0]
        raise ConfigError(f"--device {name}: not usable on this machine ({why})") from None
    return device


def set_cpu_threads(threads: int | None) -> int:
    """Torch's CPU threads for the policy: ``threads``, else all that torch would use but one, which is left to
    the event loop (intra-op threads spinning on its core slow every request, by tens of times when cores are
    scarce)."""
    n = threads if threads is not None else max(1, torch.get_num_threads() - 1)
    torch.set_num_threads(n)
    return n


def serve(policy: ServedPolicy, cfg: ServerConfig, verbose: bool = False, exit_with_stdin: bool = False) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM (or stdin's end, when ``exit_with_stdin``), logging to
    stderr; websockets' own lines (every connection opened and closed, every health check answered) only when
    ``verbose``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("websockets").setLevel(logging.INFO if verbose else logging.WARNING)
    PolicyServer(policy, cfg).run(stop_on_eof=sys.stdin.buffer if exit_with_stdin else None)
