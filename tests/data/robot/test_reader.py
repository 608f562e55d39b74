"""Windows and pad masks at episode edges, episode subsets, the split by episode, and DataLoader workers."""

import gc

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from longboat.data.robot import RobotDataError, RobotDataset, split_episodes
from longboat.data.robot.encode import video_info
from tests.data.robot.conftest import LENGTHS

STARTS = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]])


def expected_window(row: int, deltas: list[int]) -> tuple[list[int], list[bool]]:
    """LeRobot's rule, written out: clamp to the episode's first/last frame, mark what fell outside."""
    ep = int(np.searchsorted(STARTS, row, side="right") - 1)
    start, end = STARTS[ep], STARTS[ep] + LENGTHS[ep]
    wanted = [row + d for d in deltas]
    return [min(max(w, start), end - 1) for w in wanted], [not start <= w < end for w in wanted]


def test_windows_clamp_and_pad_at_episode_edges(written):
    root, episodes = written
    rows = [f for frames in episodes for f in frames]
    window = {"observation.state": [-0.3, -0.1, 0.0], "action": [0.0, 0.1, 0.2, 0.3, 0.4],
              "observation.images.front": [-0.1, 0.0]}
    ds = RobotDataset(root, delta_timestamps=window)
    for row in (0, 1, 11, 12, 13, 18, 19, 33):  # first/last frames of each episode and their neighbours
        item = ds[row]
        for key, offsets in window.items():
            deltas = [round(o * 10) for o in offsets]
            src, pad = expected_window(row, deltas)
            assert item[f"{key}_is_pad"].tolist() == pad, (row, key)
            if key == "observation.images.front":
                assert item[key].shape == (2, 3, 32, 48)
                continue
            assert item[key].shape == (len(deltas), *rows[0][key].shape)
            np.testing.assert_array_equal(item[key].numpy(), np.stack([rows[s][key] for s in src]))
    # Video frames of a window: the frame at a padded offset is the episode's first frame.
    first = ds[12]["observation.images.front"]
    assert torch.equal(first[0], first[1])
    assert not torch.equal(ds[13]["observation.images.front"][0], ds[13]["observation.images.front"][1])


def test_image_window_and_unwindowed_keys(written):
    root, episodes = written
    ds = RobotDataset(root, delta_timestamps={"observation.images.wrist": [-0.1, 0.0]})
    item = ds[0]
    assert item["observation.images.wrist"].shape == (2, 3, 16, 24)
    assert item["observation.images.wrist_is_pad"].tolist() == [True, False]
    assert item["observation.state"].shape == (5,) and item["observation.images.front"].shape == (3, 32, 48)


def test_only_the_chosen_cameras_are_decoded(written):
    root, _ = written
    item = RobotDataset(root, cameras=["observation.images.wrist"])[3]
    assert "observation.images.front" not in item and item["observation.images.wrist"].shape == (3, 16, 24)
    assert not any(k.startswith("observation.images") for k in RobotDataset(root, cameras=[])[3])
    with pytest.raises(RobotDataError, match="'observation.state' is not a camera"):
        RobotDataset(root, cameras=["observation.state"])


def test_episode_subset(written):
    root, episodes = written
    ds = RobotDataset(root, episodes=[2, 0], delta_timestamps={"action": [0.0, 0.1]})
    assert ds.episode_indices == [0, 2] and len(ds) == LENGTHS[0] + LENGTHS[2]
    item = ds[LENGTHS[0]]  # the first frame of episode 2
    assert item["episode_index"].item() == 2 and item["index"].item() == STARTS[2]
    np.testing.assert_array_equal(item["action"][1].numpy(), episodes[2][1]["action"])
    last = ds[len(ds) - 1]
    assert last["action_is_pad"].tolist() == [False, True]
    with pytest.raises(RobotDataError, match="episode 7 does not exist"):
        RobotDataset(root, episodes=[0, 7])


def test_offsets_must_be_whole_frames(written):
    root, _ = written
    with pytest.raises(RobotDataError, match=r"delta_timestamps.action: offset\(s\) \[0.05\] are not multiples"):
        RobotDataset(root, delta_timestamps={"action": [0.0, 0.05]})


def test_split_by_episode_is_seeded_and_disjoint():
    train, valid = split_episodes(range(10), 0.2, seed=3)
    assert len(valid) == 2 and sorted(train + valid) == list(range(10)) and not set(train) & set(valid)
    assert split_episodes(range(10), 0.2, seed=3) == (train, valid)
    assert any(split_episodes(range(10), 0.2, seed=s)[1] != valid for s in range(4, 10))
    assert split_episodes([4, 5, 6], 0.01, seed=0)[1] != []  # a positive fraction keeps one episode
    with pytest.raises(RobotDataError, match="leaves none for training"):
        split_episodes([1], 0.5, seed=0)


def _collect(worker_id: int) -> None:
    gc.collect()


def test_loader_workers_match_serial(written):
    """Decoders open lazily inside each worker; batches equal the single-process ones. Containers the parent
    dropped (PyAV's objects sit in reference cycles) are not freed by a collection inside a worker: freeing a
    libdav1d context there hangs (without the fix this test times out after 60 s)."""
    root, _ = written
    ds = RobotDataset(root, delta_timestamps={"observation.images.front": [-0.1, 0.0], "action": [0.0, 0.1]})
    ds[5]  # opens a container in this process: workers must not use it
    serial = [ds[i] for i in range(len(ds))]
    gc.disable()  # what this process dropped stays garbage until the workers fork
    try:
        video_info(root / ds.meta.episodes.video_file["observation.images.front"][0])  # a closed container, dropped
        dropped = RobotDataset(root)
        dropped[0]
        del dropped
        loader = DataLoader(ds, batch_size=4, num_workers=2, drop_last=True, worker_init_fn=_collect, timeout=60)
        batches = list(loader)
    finally:
        gc.enable()
    for b, batch in enumerate(batches):
        for j in range(4):
            for key in ("observation.images.front", "action", "action_is_pad", "index"):
                assert torch.equal(batch[key][j], serial[4 * b + j][key]), key
        assert batch["task"] == [serial[4 * b + j]["task"] for j in range(4)]
