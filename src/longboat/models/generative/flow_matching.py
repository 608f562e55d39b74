"""Flow matching (Lipman et al., 2023; rectified flow, Liu et al., 2023): training times, the interpolant, the velocity
target, and Euler / Heun sampling over a velocity function.

Convention (pi0's): t = 0 is data and t = 1 is noise, x_t = t·noise + (1 − t)·x0, and the network regresses the
velocity v = dx_t/dt = noise − x0; sampling integrates dx/dt = v from t = 1 down to t = 0. Times are drawn from
uniform numbers the caller supplies, so a model keeps its own (e.g. keyed) randomness.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

Velocity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x_t [B, ...], t [B]) -> v [B, ...]


# ---- training times ------------------------------------------------------------------------------------------------
def uniform_time(u: torch.Tensor) -> torch.Tensor:
    """t ~ U[0, 1): the uniform draws themselves."""
    return u


def beta_time(u: torch.Tensor, alpha: float = 1.5, low: float = 0.001) -> torch.Tensor:
    """pi0's times: Beta(alpha, 1) by inverse CDF (its CDF is t^alpha), scaled to (low, 1]; alpha > 1 favours the
    noisy end (mean (1 − low)·alpha / (alpha + 1) + low)."""
    return (1 - low) * u.pow(1 / alpha) + low


def logit_normal_time(u: torch.Tensor, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
    """SD3's logit-normal times: sigmoid(mean + std·z), z standard normal by inverse CDF of ``u``; mass in the
    middle of (0, 1) (median sigmoid(mean))."""
    z = math.sqrt(2) * torch.erfinv(2 * u - 1)
    return torch.sigmoid(mean + std * z)


def mode_time(u: torch.Tensor, scale: float = 1.29) -> torch.Tensor:
    """SD3's mode sampling with heavy tails: 1 − u − scale·(cos²(π·u/2) − 1 + u); scale 0 is uniform, larger scales
    put more mass in the middle (monotone in u for scale in [−1, 2/(π − 2)])."""
    return 1 - u - scale * (torch.cos(math.pi / 2 * u) ** 2 - 1 + u)


TIME_DISTRIBUTIONS = {"uniform": uniform_time, "beta": beta_time, "logit_normal": logit_normal_time,
                      "mode": mode_time}


def sample_time(u: torch.Tensor, distribution: str = "beta", shift: float | None = None, **params) -> torch.Tensor:
    """Training times from uniform draws ``u`` in [0, 1): ``distribution`` (one of TIME_DISTRIBUTIONS, with its
    ``params``), then ``shift_time`` when ``shift`` is given."""
    t = TIME_DISTRIBUTIONS[distribution](u, **params)
    return t if shift is None else shift_time(t, shift)


def shift_time(t: torch.Tensor | float, shift: float) -> torch.Tensor | float:
    """SD3's timestep shift: shift·t / (1 + (shift − 1)·t). Monotone, keeps 0 and 1; shift > 1 moves times toward
    the noisy end (t = 1), as larger samples (more pixels, longer videos) need."""
    return shift * t / (1 + (shift - 1) * t)


def resolution_shift(seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096, base_shift: float = 0.5,
                     max_shift: float = 1.15) -> float:
    """Flux's resolution-dependent shift as the ``shift`` of ``shift_time``: exp(mu), mu linear in the token count
    from ``base_shift`` at ``base_seq_len`` to ``max_shift`` at ``max_seq_len`` (diffusers' ``calculate_shift``; its
    exponential time shift with exponent 1, exp(mu) / (exp(mu) + 1/t − 1), is shift_time with shift = exp(mu))."""
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return math.exp(base_shift + slope * (seq_len - base_seq_len))


# ---- interpolant and target ----------------------------------------------------------------------------------------
def _per_sample(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """t [B] shaped to broadcast over ``like`` [B, ...]."""
    return t.view(-1, *([1] * (like.ndim - 1)))


def interpolate(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = t·noise + (1 − t)·x0 at per-sample times ``t`` [B]: x0 at t = 0, the noise at t = 1."""
    t = _per_sample(t, x0)
    return t * noise + (1 - t) * x0


def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The velocity dx_t/dt = noise − x0 the network regresses."""
    return noise - x0


# ---- sampling -------------------------------------------------------------------------------------------------------
def time_grid(steps: int, shift: float | None = None) -> tuple[list[float], list[float]]:
    """(the ``steps`` times each step starts at, from 1 down, and each step's size): ``steps`` equal steps, or with
    ``shift`` the equal grid mapped through ``shift_time`` (for shift > 1, finer steps near the noisy end)."""
    dt = 1.0 / steps
    if shift is None:
        return [1.0 - i * dt for i in range(steps)], [dt] * steps
    grid = [shift_time(1.0 - i * dt, shift) for i in range(steps)] + [0.0]
    return grid[:-1], [a - b for a, b in zip(grid, grid[1:])]


def euler_sample(velocity: Velocity, noise: torch.Tensor, steps: int, shift: float | None = None) -> torch.Tensor:
    """Integrate dx/dt = velocity(x, t) from ``noise`` at t = 1 to t = 0 in ``steps`` Euler steps (first order)."""
    x = noise
    times, sizes = time_grid(steps, shift)
    for t, h in zip(times, sizes):
        x = x - h * velocity(x, torch.full((x.shape[0],), t, device=x.device, dtype=x.dtype))
    return x


def heun_sample(velocity: Velocity, noise: torch.Tensor, steps: int, shift: float | None = None) -> torch.Tensor:
    """Integrate as ``euler_sample`` with Heun's method (second order, two velocity calls a step): an Euler step,
    then the step again with the mean of the velocities at both ends."""
    x = noise
    times, sizes = time_grid(steps, shift)
    for t, h in zip(times, sizes):
        v = velocity(x, torch.full((x.shape[0],), t, device=x.device, dtype=x.dtype))
        x_next = x - h * v
        v_next = velocity(x_next, torch.full((x.shape[0],), t - h, device=x.device, dtype=x.dtype))
        x = x - h * 0.5 * (v + v_next)
    return x
