"""Sampling settings, checked before anything heavy loads: ``longboat generate --top-p 2`` answers at once."""

from __future__ import annotations

import math

from longboat.config.base import ConfigError


def check_sampling(
    max_new_tokens: int = 128,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    num_samples: int = 1,
) -> None:
    """Refuse sampling settings outside their range, before any model is loaded."""
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"temperature must be 0 (greedy) or positive, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k must be at least 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
    if num_samples < 1:
        raise ConfigError(f"num_samples must be at least 1, got {num_samples}")
