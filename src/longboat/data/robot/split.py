"""Train/validation split of a robot dataset by whole episodes, so no episode's frames land on both sides."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from longboat.data.robot.errors import RobotDataError


def split_episodes(episodes: Sequence[int], valid_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, valid) episode indices, each sorted; ``round(valid_fraction * n)`` episodes (at least one when
    the fraction is positive) are drawn for validation by a generator seeded with ``seed``."""
    if not 0 <= valid_fraction < 1:
        raise RobotDataError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
    eps = np.asarray(sorted(episodes), dtype=np.int64)
    n_valid = max(1, round(valid_fraction * len(eps))) if valid_fraction > 0 else 0
    if n_valid >= len(eps):
        raise RobotDataError(f"valid_fraction {valid_fraction} of {len(eps)} episodes leaves none for training")
    valid = np.random.default_rng(seed).choice(eps, size=n_valid, replace=False)
    train = np.setdiff1d(eps, valid)
    return train.tolist(), np.sort(valid).tolist()
