"""Shared by the transform tests: LeRobot-shaped statistics, a pipeline builder, the numpy reference of
normalize, and a pipeline of every transform read from YAML with an item to apply it to."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from longboat.data.robot.transforms import Pipeline


STATE, ACTION, TOP, WRIST = "observation.state", "action", "observation.images.top", "observation.images.wrist"
STAT_NAMES = ("min", "max", "mean", "std", "q01", "q10", "q50", "q90", "q99")


def vector_stats(rng: np.random.Generator, dim: int) -> dict:
    """LeRobot-shaped statistics of a feature [dim] (float64, as a reader hands them over)."""
    x = rng.normal(size=(500, dim)) * rng.uniform(0.5, 3, dim) + rng.normal(size=dim)
    q = {f"q{p:02d}": np.quantile(x, p / 100, axis=0) for p in (1, 10, 50, 90, 99)}
    return {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0), "count": np.array([500]), **q}


@pytest.fixture
def stats():
    rng = np.random.default_rng(0)
    image = {"mean": np.full((3, 1, 1), 0.5), "std": np.full((3, 1, 1), 0.25), "min": np.zeros((3, 1, 1)),
             "max": np.ones((3, 1, 1)), "count": np.array([500])}
    return {STATE: vector_stats(rng, 9), ACTION: vector_stats(rng, 7), TOP: image}


def f32(stats: dict, feature: str, stat: str) -> np.ndarray:
    return np.asarray(stats[feature][stat], dtype=np.float32)


def build(specs, stats=None, **kwargs) -> Pipeline:
    return Pipeline.from_config(specs, stats, **kwargs)


def numpy_normalize(x: np.ndarray, stats: dict, feature: str, mode: str, eps: float = 1e-6) -> np.ndarray:
    x, eps = x.astype(np.float32), np.float32(eps)
    if mode == "mean_std":
        return (x - f32(stats, feature, "mean")) / (f32(stats, feature, "std") + eps)
    lo, hi = {"min_max": ("min", "max"), "quantiles": ("q01", "q99")}[mode]
    lo, hi = f32(stats, feature, lo), f32(stats, feature, hi)
    return (x - lo) / (hi - lo + eps) * np.float32(2) - np.float32(1)


PIPELINE_YAML = f"""
- type: delta_actions
  dims: [0, 1, 2, 3, 4, 5]
- type: normalize
  features: {{{ACTION}: quantiles, {STATE}: mean_std, {TOP}: min_max}}
- {{type: pad_dim, keys: [{STATE}, {ACTION}], dim: 32}}
- {{type: pad_horizon, horizon: 50}}
- {{type: resize_pad, keys: [{TOP}, {WRIST}], size: [32, 32]}}
- {{type: random_crop, keys: [{TOP}, {WRIST}], size: [28, 28]}}
- {{type: color_jitter, keys: [{TOP}], brightness: 0.2, contrast: 0.2, saturation: 0.2, hue: 0.05}}
"""


@pytest.fixture
def pipeline(tmp_path, stats):
    path = tmp_path / "transforms.yaml"
    path.write_text(PIPELINE_YAML)
    return Pipeline.from_file(path, stats, seed=7)


def sample(batch: tuple[int, ...] = (), steps: int = 40) -> dict:
    return {STATE: torch.randn(*batch, 9), ACTION: torch.randn(*batch, steps, 7) * 2,
            TOP: torch.rand(*batch, 3, 48, 64), WRIST: torch.rand(*batch, 3, 40, 40), "task": "stack the cups"}
