"""Random numbers that are a function of a key, not of a generator's history.

A training sample's draws (diffusion noise and timesteps, flow-matching times, the CVAE sample, class dropout) come
from its ``noise_key``, itself a hash of (run seed, the sample's position in the job's sample stream). The same sample
therefore draws the same numbers on one process or eight, with any number of loader workers, and after a resume.

The generator is a counter-based hash (SplitMix64's finaliser) on int64 tensors, so it runs on any device with
plain integer ops: element ``i`` of stream ``s`` for key ``k`` is ``hash(k, s, i)``.
"""

from __future__ import annotations

import math

import torch

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _mix_int(x: int) -> int:
    """``_mix`` on one unsigned 64-bit Python int: the same bits, without building a tensor per sample."""
    x = ((x ^ (x >> 30)) * (_MIX1 & _MASK64)) & _MASK64
    x = ((x ^ (x >> 27)) * (_MIX2 & _MASK64)) & _MASK64
    return x ^ (x >> 31)


def noise_key(seed: int, position: int) -> int:
    """The key of the sample at ``position`` in the sample stream of a run seeded ``seed`` (a signed int64)."""
    return _signed(_mix_int(_mix_int((seed * 0x9E3779B97F4A7C15 + position) & _MASK64)))


def _bits(keys: torch.Tensor, shape: tuple[int, ...], stream: int, kind: int) -> torch.Tensor:
    """Well-mixed int64 bit patterns [B, *shape] for int64 ``keys`` [B]. ``kind`` separates the distributions, so
    stream 1 of one never repeats the numbers of stream 1 (or any stream) of another."""
    n = math.prod(shape)
    counter = torch.arange(n, device=keys.device, dtype=torch.int64)
    x = keys.to(torch.int64).reshape(-1, 1) + _signed((stream + 1) * 0xD1B54A32D192ED03 + kind * 0x8CB92BA72F3D8DD7)
    x = _mix(x) + (counter + 1) * _GOLDEN
    return _mix(x).reshape(keys.shape[0], *shape)


def _uniform(keys: torch.Tensor, shape: tuple[int, ...], stream: int, kind: int, dtype: torch.dtype) -> torch.Tensor:
    top = _shr(_bits(keys, tuple(shape), stream, kind), 40)
    return ((top.to(torch.float64) + 0.5) / float(1 << 24)).to(dtype)


def keyed_uniform(keys: torch.Tensor, shape: tuple[int, ...], stream: int = 0,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Uniform numbers in the open interval (0, 1), [B, *shape], from 24 high bits of the hash."""
    return _uniform(keys, shape, stream, 0, dtype)


def keyed_normal(keys: torch.Tensor, shape: tuple[int, ...], stream: int = 0,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal numbers [B, *shape] (Box–Muller over two uniform streams)."""
    u1 = _uniform(keys, shape, stream, 1, torch.float64)
    u2 = _uniform(keys, shape, stream, 2, torch.float64)
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)).to(dtype)


def keyed_randint(keys: torch.Tensor, shape: tuple[int, ...], high: int, stream: int = 0) -> torch.Tensor:
    """Integers uniform in [0, high), [B, *shape] (e.g. diffusion timesteps)."""
    return (_uniform(keys, shape, stream, 3, torch.float64) * high).long().clamp_(max=high - 1)
