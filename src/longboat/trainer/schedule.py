"""Learning-rate schedules as multipliers of the peak rate: warmup + cosine, warmup-stable-decay, constant."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import model_validator

from longboat.config.base import StrictModel


class ScheduleConfig(StrictModel):
    kind: Literal["cosine", "wsd", "constant"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    # wsd: the final fraction of steps over which the rate decays (linearly or as 1 - sqrt) to min.
    decay_fraction: float = 0.2
    decay_shape: Literal["linear", "sqrt"] = "linear"

    @model_validator(mode="after")
    def _check(self) -> "ScheduleConfig":
        if self.warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError("min_lr_ratio must be in [0, 1]")
        if not 0.0 <= self.decay_fraction <= 1.0:
            raise ValueError("decay_fraction must be in [0, 1]")
        return self


def lr_multiplier(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """Multiplier for the update made at ``step`` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind == "constant":
        return 1.0
    lo = cfg.min_lr_ratio
    if cfg.kind == "cosine":
        span = max(total_steps - cfg.warmup_steps, 1)
        progress = min((step - cfg.warmup_steps) / span, 1.0)
        return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * progress))
    decay_steps = int(round(total_steps * cfg.decay_fraction))
    decay_start = total_steps - decay_steps
    if step < decay_start or decay_steps == 0:
        return 1.0
    progress = (step - decay_start + 1) / decay_steps
    drop = progress if cfg.decay_shape == "linear" else math.sqrt(progress)
    return lo + (1 - lo) * (1 - drop)


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, cfg: ScheduleConfig):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, total_steps, cfg))
