"""Model FLOPs utilisation: achieved FLOP/s over the device's peak (a table for GPUs, measured on CPU)."""

from __future__ import annotations

import functools
import time

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


@functools.lru_cache(maxsize=None)
def measured_cpu_peak_flops(dtype: torch.dtype = torch.float32, max_n: int = 1024, budget_s: float = 0.2) -> float:
    """Best FLOP/s of an n×n matmul on this CPU: the ceiling MFU is measured against.

    n doubles from 256 until one product takes 0.1 s or reaches ``max_n``, and only that size is repeated: large
    enough to reach the peak where the dtype is fast, while a CPU without native bf16 (seconds for one 1024² bf16
    product) stops early. The best of the products run in ``budget_s`` (three at least) counts: the first few run
    while the cores and the thread pool wake up, and the best of three of 1024² fp32 read 0.5-0.9 of the best of
    twenty on two cores, which overstated MFU by as much. On a shared machine the figure still moves with the load.
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


def peak_flops(device: torch.device, dtype: torch.dtype) -> float:
    """The accelerator's table entry by its device name, else (CPU, or a device not in the table) a measurement."""
    device_name = getattr(torch.get_device_module(device.type), "get_device_name", None) if device.type != "cpu" else None
    if device_name is not None:
        peak = gpu_peak_flops(device_name(device))
        if peak is not None:
            return peak if dtype != torch.float32 else peak / 2  # TF32 rate is half of bf16
    peak = measured_cpu_peak_flops(torch.float32)
    # Without native bf16 a CPU multiplies bf16 at ~1/50 of its fp32 rate, and a bf16 run's fp32 parts (norms,
    # softmax) outrun that "peak": MFU read above 1. The ceiling is the best the CPU does in either dtype.
    return max(peak, measured_cpu_peak_flops(torch.bfloat16)) if dtype == torch.bfloat16 else peak


def cpu_bf16_is_slow() -> bool:
    """Whether this CPU multiplies bf16 matrices more slowly than fp32 (no native bf16: AVX2 and older)."""
    return measured_cpu_peak_flops(torch.bfloat16) < measured_cpu_peak_flops(torch.float32)
