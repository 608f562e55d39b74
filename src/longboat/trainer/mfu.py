"""Model FLOPs utilisation: achieved FLOP/s over the device's peak (a table for GPUs, measured on CPU)."""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

# Dense bf16 peak (no sparsity), FLOP/s.
_GPU_PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe part is lower and matched below
    "H100 PCIe": 756e12,
    "H800": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 125e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


def gpu_peak_flops(name: str) -> float | None:
    for key in sorted(_GPU_PEAK_BF16, key=len, reverse=True):
        if key in name:
            return _GPU_PEAK_BF16[key]
    return None


def cpu_peak_cache_file() -> Path:
    """Where measured CPU peaks are kept: ``$LONGBOAT_CACHE``, else ``$XDG_CACHE_HOME/longboat``, else
    ``~/.cache/longboat``."""
    root = os.environ.get("LONGBOAT_CACHE") or (
        Path(os.environ["XDG_CACHE_HOME"]) / "longboat" if os.environ.get("XDG_CACHE_HOME")
        else Path.home() / ".cache" / "longboat")
    return Path(root) / "cpu_peak_flops.json"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_peak_key(dtype: torch.dtype) -> str:
    """What a measured peak depends on: the CPU, its cores, torch's threads, torch's version and the dtype."""
    return (f"{_cpu_model()} | {os.cpu_count()} cpus | {torch.get_num_threads()} threads | "
            f"torch {torch.__version__} | {str(dtype).removeprefix('torch.')}")


def _read_cache(file: Path) -> dict[str, float]:
    """The cached peaks; an unreadable or malformed file counts as empty (it is rewritten)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0}


def _write_cache(file: Path, peaks: dict[str, float]) -> None:
    """Write ``peaks`` through a unique temporary name and a rename: readers (other ranks) never see half a file. A
    cache that cannot be written is no error: the peak is measured again next time."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(peaks, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, file)
    except OSError:
        pass


def measured_cpu_peak_flops(dtype: torch.dtype = torch.float32) -> float:
    """This CPU's peak matmul FLOP/s in ``dtype``: measured once (before a run starts, when the CPU is idle) and
    kept in :func:`cpu_peak_cache_file`, so a run never reads a figure sampled while other work runs."""
    file, key = cpu_peak_cache_file(), cpu_peak_key(dtype)
    peaks = _read_cache(file)
    if key not in peaks:
        peaks[key] = measure_cpu_matmul_flops(dtype)
        _write_cache(file, {**_read_cache(file), key: peaks[key]})
    return peaks[key]


def raise_cpu_peak_flops(dtype: torch.dtype, achieved: float) -> float:
    """Record that this CPU reached ``achieved`` FLOP/s in ``dtype``; return the peak, now at least that."""
    file, key = cpu_peak_cache_file(), cpu_peak_key(dtype)
    peaks = _read_cache(file)
    if achieved > peaks.get(key, 0.0):
        peaks[key] = achieved
        _write_cache(file, peaks)
    return peaks[key]


def measure_cpu_matmul_flops(dtype: torch.dtype = torch.float32, max_n: int = 1024, budget_s: float = 0.5) -> float:
    """Best FLOP/s of an n×n matmul on this CPU: the ceiling MFU is measured against.

    n doubles from 256 until one product takes 0.1 s or reaches ``max_n``, and only that size is repeated: large
    enough to reach the peak where the dtype is fast, while a CPU without native bf16 (seconds for one 1024² bf16
    product) stops early. The best of the products run in ``budget_s`` (three at least) counts: the first few run
    while the cores and the thread pool wake up, and the best of three of 1024² fp32 read 0.5-0.9 of the best of
    twenty on two cores, which overstated MFU by as much.
    """
    n = 256
    while True:
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        t = time.perf_counter()
        a @ b
        best = time.perf_counter() - t
        if n >= max_n or best > 0.1:
            break
        n *= 2
    end, runs = time.perf_counter() + budget_s, 1
    while runs < 3 or time.perf_counter() < end:
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
        runs += 1
    return 2 * n**3 / best


@dataclass
class Peak:
    """The FLOP/s a device's MFU divides by: a table entry, or (``measured_dtype`` set) a measured CPU rate."""

    flops: float
    measured_dtype: torch.dtype | None = None

    def mfu(self, achieved: float) -> float:
        """``achieved`` FLOP/s (one device's) over the peak. A CPU that outruns its measured peak shows that the
        measurement fell short: the peak, and its cache, are raised to the achieved rate, so MFU is at most 1."""
        if self.measured_dtype is not None and achieved > self.flops:
            self.flops = raise_cpu_peak_flops(self.measured_dtype, achieved)
        return achieved / self.flops


def peak_flops(device: torch.device, dtype: torch.dtype) -> Peak:
    """The accelerator's table entry by its device name, else (CPU, or a device not in the table) a measurement."""
    device_name = getattr(torch.get_device_module(device.type), "get_device_name", None) if device.type != "cpu" else None
    if device_name is not None:
        peak = gpu_peak_flops(device_name(device))
        if peak is not None:
            return Peak(peak if dtype != torch.float32 else peak / 2)  # TF32 rate is half of bf16
    fp32 = measured_cpu_peak_flops(torch.float32)
    if dtype != torch.bfloat16:
        return Peak(fp32, torch.float32)
    # Without native bf16 a CPU multiplies bf16 at ~1/50 of its fp32 rate, and a bf16 run's fp32 parts (norms,
    # softmax) outrun that "peak": MFU read above 1. The ceiling is the best the CPU does in either dtype.
    bf16 = measured_cpu_peak_flops(torch.bfloat16)
    return Peak(max(fp32, bf16), torch.bfloat16 if bf16 >= fp32 else torch.float32)


def cpu_bf16_is_slow() -> bool:
    """Whether this CPU multiplies bf16 matrices more slowly than fp32 (no native bf16: AVX2 and older)."""
    return measured_cpu_peak_flops(torch.bfloat16) < measured_cpu_peak_flops(torch.float32)
