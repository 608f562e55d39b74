"""Dataset statistics as LeRobot computes them: per episode, then aggregated into ``meta/stats.json``.

Per feature: min, max, mean, std, count and the quantiles q01 q10 q50 q90 q99. Quantiles are read from a
5000-bin histogram spanning the episode's range, interpolated within the bin (LeRobot's estimator). Camera
statistics are per channel, shape (3, 1, 1) in [0, 1], from a sample of the episode's frames (every frame up
to 100, then about ``n ** 0.75``), each frame strided down when its larger side is 300 pixels or more.
Aggregation weights means, variances (parallel algorithm) and quantiles by each episode's count.
"""

from __future__ import annotations

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{round(q * 100):02d}" for q in QUANTILES)
STAT_KEYS = ("min", "max", "mean", "std", "count", *QUANTILE_KEYS)
HISTOGRAM_BINS = 5000


def vector_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Statistics over axis 0 of [N, *shape] (or [N] for scalars, giving shape (1,))."""
    x = values.astype(np.float64).reshape(len(values), -1)
    shape = values.shape[1:] or (1,)
    out = _column_stats(x)
    return {k: v if k == "count" else v.reshape(shape) for k, v in out.items()}


def image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel statistics of uint8 frames [N, H, W, C], sampled as LeRobot samples, in [0, 1], shape (C,1,1)."""
    picked = frames[sample_indices(len(frames))]
    h, w = picked.shape[1:3]
    if max(h, w) >= 300:
        step = int(w / 150) if w > h else int(h / 150)
        picked = picked[:, ::step, ::step]
    pixels = picked.reshape(-1, picked.shape[-1]).astype(np.float64)
    out = _column_stats(pixels)
    out = {k: v if k == "count" else (v / 255.0).reshape(-1, 1, 1) for k, v in out.items()}
    out["count"] = np.array([len(picked)])
    return out


def sample_indices(n: int) -> np.ndarray:
    """Evenly spaced frame indices: all of them up to 100 frames, then ``n ** 0.75`` (at most 10,000)."""
    count = n if n < 100 else max(100, min(int(n**0.75), 10_000))
    return np.round(np.linspace(0, n - 1, count)).astype(int)


def _column_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """Statistics of each column of [N, D] float64."""
    mean = x.mean(axis=0)
    out = {"min": x.min(axis=0), "max": x.max(axis=0), "mean": mean, "std": x.std(axis=0),
           "count": np.array([len(x)])}
    for key, q in zip(QUANTILE_KEYS, QUANTILES):
        out[key] = mean.copy() if len(x) < 2 else np.array([_histogram_quantile(col, q) for col in x.T])
    return out


def _histogram_quantile(col: np.ndarray, q: float) -> float:
    edges = np.linspace(col.min() - 1e-10, col.max() + 1e-10, HISTOGRAM_BINS + 1)
    cumsum = np.cumsum(np.histogram(col, bins=edges)[0])
    target = q * len(col)
    i = int(np.searchsorted(cumsum, target))
    if i == 0:
        return float(edges[0])
    if i >= len(cumsum):
        return float(edges[-1])
    before = cumsum[i - 1]
    in_bin = cumsum[i] - before
    if in_bin == 0:
        return float(edges[i])
    return float(edges[i] + (target - before) / in_bin * (edges[i + 1] - edges[i]))


def aggregate_stats(per_episode: list[dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    """Combine episode statistics: exact min, max, mean and std; count-weighted quantiles (LeRobot 0.4's rule)."""
    keys = {k for ep in per_episode for k in ep}
    out = {}
    for key in sorted(keys):
        parts = [ep[key] for ep in per_episode if key in ep]
        counts = np.stack([p["count"] for p in parts]).astype(np.float64)  # [E, 1]
        means = np.stack([p["mean"] for p in parts])
        w = counts.reshape(-1, *([1] * (means.ndim - 1)))
        total = counts.sum()
        mean = (means * w).sum(axis=0) / total
        var = ((np.stack([p["std"] for p in parts]) ** 2 + (means - mean) ** 2) * w).sum(axis=0) / total
        agg = {"min": np.min(np.stack([p["min"] for p in parts]), axis=0),
               "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
               "mean": mean, "std": np.sqrt(var), "count": np.array([int(total)])}
        for q in (q for q in QUANTILE_KEYS if all(q in p for p in parts)):  # v2.1 statistics have none
            agg[q] = (np.stack([p[q] for p in parts]) * w).sum(axis=0) / total
        out[key] = agg
    return out


def stats_to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    return {k: {s: np.asarray(v).tolist() for s, v in st.items()} for k, st in stats.items()}
