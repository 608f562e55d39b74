"""Split strings (``"969,30,1"``) to train/valid/test weights and document ranges, as megatron-core parses them."""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from longboat.config.base import ConfigError

SPLIT_NAMES = ("train", "valid", "test")
_NUMBER = r"\s*(\d+\.?\d*|\.\d+)\s*"
_SPLIT_RE = re.compile(rf"{_NUMBER}(?:[,/]{_NUMBER}){{0,2}}")


def normalize(weights: Sequence[float]) -> list[float]:
    """Weights divided by their sum, in float64 (the same arithmetic as Megatron's ``normalize``)."""
    w = np.asarray(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()


def split_weights(split: str) -> list[float]:
    """``"969,30,1"`` -> normalised [train, valid, test] weights; missing parts are 0."""
    if not isinstance(split, str) or not _SPLIT_RE.fullmatch(split):
        raise ConfigError(
            f"split {split!r}: expected up to three non-negative numbers separated by commas, e.g. '969,30,1'"
        )
    parts = [float(p) for p in re.split(r"[,/]", split)]
    if sum(parts) <= 0:
        raise ConfigError(f"split {split!r}: the weights sum to zero; give at least one split a positive weight")
    return normalize(parts + [0.0] * (len(SPLIT_NAMES) - len(parts)))


def parse_split(split: str, num_documents: int) -> list[tuple[int, int] | None]:
    """Document ranges ``[start, end)`` of train/valid/test for a file of ``num_documents``; ``None`` for a
    split of weight 0. Bounds are the cumulative weights times the count, rounded half to even (Python's
    ``round``), as Megatron computes them.
    """
    ranges: list[tuple[int, int] | None] = []
    low, n = 0.0, float(num_documents)
    for weight in split_weights(split):
        high = low + weight
        ranges.append(None if high <= low else (int(round(low * n)), int(round(high * n))))
        low = high
    return ranges
