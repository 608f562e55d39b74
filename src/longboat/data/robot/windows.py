"""Observation and action windows: ``delta_timestamps`` turned into row offsets, clamped at episode edges.

As LeRobot does, an offset in seconds becomes ``round(offset * fps)`` frames; it must be a whole number of
frames within the tolerance. Rows outside the sample's episode are replaced by its first or last frame and
marked in ``<key>_is_pad``.
"""

from __future__ import annotations

import numpy as np

from longboat.data.robot.errors import RobotDataError


def delta_indices(delta_timestamps: dict[str, list[float]], fps: float, tolerance_s: float) -> dict[str, np.ndarray]:
    out = {}
    for key, offsets in delta_timestamps.items():
        if not isinstance(offsets, (list, tuple)) or not offsets:
            raise RobotDataError(f"delta_timestamps.{key}: expected a non-empty list of offsets in seconds")
        try:
            seconds = np.asarray(offsets, dtype=np.float64)
        except (TypeError, ValueError):
            raise RobotDataError(f"delta_timestamps.{key}: expected a list of offsets in seconds, "
                                 f"got {offsets}") from None
        frames = seconds * fps
        if seconds.ndim != 1 or not np.isfinite(frames).all():
            raise RobotDataError(f"delta_timestamps.{key}: offsets {offsets} at fps {fps} are not finite frame counts")
        rounded = np.round(frames)
        off = np.abs(frames - rounded) / fps > tolerance_s
        if off.any():
            raise RobotDataError(f"delta_timestamps.{key}: offset(s) {np.asarray(offsets)[off].tolist()} are not "
                                 f"multiples of 1/fps = {1 / fps:.6g}s within {tolerance_s}s")
        out[key] = rounded.astype(np.int64)
    return out


def window_rows(row: int, ep_start: int, ep_end: int, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows clamped to the episode [ep_start, ep_end), is_pad) for a sample at ``row``."""
    wanted = row + deltas
    return np.clip(wanted, ep_start, ep_end - 1), (wanted < ep_start) | (wanted >= ep_end)
