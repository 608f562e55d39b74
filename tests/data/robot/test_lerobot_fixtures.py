"""Datasets written by LeRobot itself (v3.0 by lerobot 0.4.4, v2.1 by 0.3.3) read as LeRobot reads them."""

from pathlib import Path

import numpy as np
import pytest

from longboat.data.robot import RobotDataset

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CAMERA = "observation.images.cam"
WINDOW = {CAMERA: [-0.1, 0.0], "observation.state": [-0.2, -0.1, 0.0], "action": [i / 10 for i in range(6)]}
EXACT = ("observation.state", "action", "index", "episode_index", "frame_index", "task_index", "timestamp",
         *(f"{k}_is_pad" for k in WINDOW))


@pytest.mark.parametrize("version", ["v30", "v21"])
def test_items_match_lerobot(version):
    fixture = FIXTURES / f"lerobot_{version}"
    ref = np.load(fixture / "reference.npz")
    ds = RobotDataset(fixture / "dataset", delta_timestamps=WINDOW)
    assert len(ds) == 74 and ds.num_episodes == 3
    assert ds.meta.version == ("v3.0" if version == "v30" else "v2.1")
    for j, i in enumerate(ref["indices"]):
        item = ds[int(i)]
        for key in EXACT:
            got = item[key].numpy()
            assert got.dtype == ref[key][j].dtype and got.shape == ref[key][j].shape, key
            np.testing.assert_array_equal(got, ref[key][j], err_msg=f"{version} item {i} {key}")
        assert item["task"] == ref["task"][j]
        frames = item[CAMERA]
        assert frames.dtype == np.float32 or str(frames.dtype) == "torch.float32"
        assert frames.shape == (2, 3, 48, 64) and 0 <= frames.min() and frames.max() <= 1
        pixels = np.round(frames.numpy() * 255).astype(np.int16)
        # Same decoder and frame choice as LeRobot's pyav backend: identical; allow one grey level of codec slack.
        assert np.abs(pixels - ref[CAMERA][j]).max() <= 1, f"{version} item {i}"


@pytest.mark.parametrize("version", ["v30", "v21"])
def test_metadata(version):
    ds = RobotDataset(FIXTURES / f"lerobot_{version}" / "dataset")
    meta = ds.meta
    assert meta.fps == 10 and meta.video_keys == [CAMERA]
    assert meta.tasks == ["push the block to the left", "lift the cup"]
    assert meta.episodes.length.tolist() == [24, 30, 20] and meta.episodes.start.tolist() == [0, 24, 54]
    assert meta.episodes.tasks[1] == ["push the block to the left", "lift the cup"]
    # v2.1 holds only per-episode statistics; they are aggregated as LeRobot aggregates them.
    state = meta.stats["observation.state"]
    assert state["count"].tolist() == [74]
    assert meta.stats[CAMERA]["mean"].shape == (3, 1, 1)
    np.testing.assert_allclose(state["mean"], ds.frames.numeric["observation.state"].mean(0), atol=1e-6)
    # Without a window a camera is one frame [C, H, W].
    assert ds[3][CAMERA].shape == (3, 48, 64)


def test_episode_statistics_match_lerobot():
    """Our statistics of each episode's state and action equal LeRobot 0.4.4's (its episode metadata)."""
    import pyarrow.parquet as pq

    from longboat.data.robot.stats import STAT_KEYS, vector_stats

    root = FIXTURES / "lerobot_v30" / "dataset"
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    ds = RobotDataset(root)
    for ep in episodes:
        rows = slice(ep["dataset_from_index"], ep["dataset_to_index"])
        for key in ("observation.state", "action", "timestamp"):
            ours = vector_stats(ds.frames.numeric[key][rows])
            for stat in STAT_KEYS:
                np.testing.assert_allclose(ours[stat], np.asarray(ep[f"stats/{key}/{stat}"]), rtol=1e-5,
                                           atol=1e-6, err_msg=f"episode {ep['episode_index']} {key} {stat}")
