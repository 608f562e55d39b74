"""Statistics against a numpy reference: per episode, aggregated, images per channel, and the written stats.json."""

import json

import numpy as np
import pytest

from longboat.data.robot.stats import (
    QUANTILE_KEYS, QUANTILES, STAT_KEYS, aggregate_stats, image_stats, sample_indices, vector_stats,
)


def test_vector_stats_match_numpy():
    x = np.random.default_rng(0).normal(size=(500, 3)).astype(np.float32) * [1, 10, 0.1]
    st = vector_stats(x)
    assert set(st) == set(STAT_KEYS) and st["count"].tolist() == [500]
    ref = x.astype(np.float64)
    np.testing.assert_array_equal(st["min"], ref.min(0))
    np.testing.assert_array_equal(st["max"], ref.max(0))
    np.testing.assert_allclose(st["mean"], ref.mean(0), rtol=1e-12)
    np.testing.assert_allclose(st["std"], ref.std(0), rtol=1e-12)
    bin_width = (ref.max(0) - ref.min(0)) / 5000
    for key, q in zip(QUANTILE_KEYS, QUANTILES):
        # A histogram estimate of the smallest value with at least q of the samples at or below it.
        exact = np.quantile(ref, q, axis=0, method="inverted_cdf")
        assert np.all(np.abs(st[key] - exact) <= 2 * bin_width), key
    scalar = vector_stats(np.arange(10, dtype=np.int64))
    assert scalar["mean"].shape == (1,) and scalar["mean"].item() == 4.5


def test_single_frame_episode_uses_the_value_for_quantiles():
    st = vector_stats(np.array([[1.0, 2.0]], dtype=np.float32))
    assert st["q01"].tolist() == [1.0, 2.0] and st["std"].tolist() == [0, 0]


def test_aggregate_is_exact_for_moments():
    rng = np.random.default_rng(1)
    parts = [rng.normal(loc=i, size=(n, 4)) for i, n in enumerate((30, 7, 120))]
    agg = aggregate_stats([{"x": vector_stats(p)} for p in parts])["x"]
    every = np.concatenate(parts)
    np.testing.assert_allclose(agg["mean"], every.mean(0), rtol=1e-10)
    np.testing.assert_allclose(agg["std"], every.std(0), rtol=1e-10)
    np.testing.assert_array_equal(agg["min"], every.min(0))
    assert agg["count"].tolist() == [157]
    counts = np.array([30, 7, 120])[:, None]
    expected_q50 = (np.stack([vector_stats(p)["q50"] for p in parts]) * counts).sum(0) / 157
    np.testing.assert_allclose(agg["q50"], expected_q50)


def test_image_stats_per_channel_in_unit_range():
    rng = np.random.default_rng(2)
    frames = rng.integers(0, 256, size=(150, 20, 30, 3), dtype=np.uint8)
    st = image_stats(frames)
    assert all(st[k].shape == (3, 1, 1) for k in STAT_KEYS if k != "count")
    picked = frames[sample_indices(150)].astype(np.float64) / 255  # 100 frames of 150, evenly spaced
    assert st["count"].tolist() == [100] and len(sample_indices(150)) == 100
    np.testing.assert_allclose(st["mean"].ravel(), picked.mean(axis=(0, 1, 2)), rtol=1e-12)
    np.testing.assert_allclose(st["std"].ravel(), picked.std(axis=(0, 1, 2)), rtol=1e-12)
    assert 0 <= st["min"].min() and st["max"].max() <= 1
    big = image_stats(np.zeros((2, 320, 400, 3), dtype=np.uint8))  # strided down like LeRobot's
    assert big["count"].tolist() == [2]


def test_written_stats_match_numpy(written):
    root, episodes = written
    stats = json.loads((root / "meta/stats.json").read_text())
    assert set(stats) >= {"observation.state", "action", "next.reward", "observation.images.front", "index"}
    state = np.stack([f["observation.state"] for frames in episodes for f in frames]).astype(np.float64)
    np.testing.assert_allclose(stats["observation.state"]["mean"], state.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["observation.state"]["std"], state.std(0), rtol=1e-6)
    np.testing.assert_allclose(stats["observation.state"]["max"], state.max(0))
    assert stats["observation.state"]["count"] == [len(state)]
    front = np.stack([f["observation.images.front"] for frames in episodes for f in frames]) / 255
    # Every frame is sampled in episodes this short, so the image mean is exact.
    np.testing.assert_allclose(np.ravel(stats["observation.images.front"]["mean"]), front.mean(axis=(0, 1, 2)))
    assert np.asarray(stats["observation.images.wrist"]["q99"]).shape == (3, 1, 1)
    reward = np.array([f["next.reward"] for frames in episodes for f in frames], dtype=np.float64)
    assert stats["next.reward"]["mean"] == pytest.approx([reward.mean()])
