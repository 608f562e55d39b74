"""Windows and pad masks at episode edges, episode subsets, cached video decoding, and DataLoader workers."""

import gc

import av
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from longboat.data.loader import EpochOrder, ResumableLoader
from longboat.data.robot import RobotDataError, RobotDataset
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


def decode_all(path) -> dict[float, np.ndarray]:
    """Every frame of a video file, decoded start to end: the truth a cached, seeking reader must return."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return {round(float(f.pts * s.time_base), 4): f.to_ndarray(format="rgb24") for f in c.decode(s)}


# Forward runs (the decoder continues), repeats (cache hits), backward jumps and far jumps (seeks), episode edges.
ORDER = [0, 1, 2, 3, 3, 2, 10, 4, 5, 6, 20, 21, 19, 33, 32, 31, 12, 11, 13, 14, 0, 33]


@pytest.mark.parametrize("cache_mb", [64, 0.02, 0])  # room for everything, for 3 frames of 32×48, for none
@pytest.mark.parametrize("fixture", ["written", "written_h264"])
def test_cached_and_continued_decoding_returns_the_frames_of_a_full_decode(fixture, cache_mb, request):
    root, _ = request.getfixturevalue(fixture)
    key = "observation.images.front"
    ds = RobotDataset(root, delta_timestamps={key: [-0.2, -0.1, 0.0]}, cache_mb=cache_mb)
    eps = ds.meta.episodes
    truth = {rel: decode_all(root / rel) for rel in set(eps.video_file[key])}
    order = [r for r in ORDER if r < len(ds)]
    for row in order:
        item = ds[row]
        ep = int(item["episode_index"])
        ts = item["timestamp"].item()
        for j, d in enumerate((-0.2, -0.1, 0.0)):
            t = min(max(ts + d, 0.0), (eps.length[ep] - 1) / 10)  # clamped to the episode, as the pad mask says
            want = truth[eps.video_file[key][ep]][round(eps.video_start[key][ep] + t, 4)]
            assert torch.equal(item[key][j], torch.from_numpy(want).permute(2, 0, 1).float() / 255), (row, j)
    assert ds.video.cache.bytes <= cache_mb * 2**20


def test_uint8_cameras_and_to_float_equal_float_items(written):
    root, _ = written
    window = {"observation.images.front": [-0.1, 0.0]}
    floats = RobotDataset(root, delta_timestamps=window)
    ints = RobotDataset(root, delta_timestamps=window, image_dtype="uint8")
    rows = [3, 4, 30]
    item = ints[3]
    assert item["observation.images.front"].dtype == torch.uint8 and item["observation.images.wrist"].dtype == torch.uint8
    batch = ints.to_float(torch.utils.data.default_collate(ints.__getitems__(rows)))
    expected = torch.utils.data.default_collate([floats[r] for r in rows])
    for key in ("observation.images.front", "observation.images.wrist", "observation.state", "index"):
        assert batch[key].dtype == expected[key].dtype and torch.equal(batch[key], expected[key]), key
    with pytest.raises(RobotDataError, match="image_dtype 'float16' is not supported"):
        RobotDataset(root, image_dtype="float16")
    with pytest.raises(RobotDataError, match="epoch_run: expected an integer >= 1, got 0"):
        RobotDataset(root, epoch_run=0)


def test_epoch_runs_with_workers_match_serial_items(written):
    """The trainer's loader with runs of neighbours, uint8 cameras and 2 workers: each batch equals the float items
    read one by one in a fresh process; a resumed loader continues with the same batches."""
    root, _ = written
    window = {"observation.images.front": [-0.2, -0.1, 0.0], "action": [0.0, 0.1]}
    ds = RobotDataset(root, delta_timestamps=window, image_dtype="uint8", epoch_run=4)
    reference = RobotDataset(root, delta_timestamps=window)

    def batches(consumed, n):
        loader = ResumableLoader(ds, 4, num_workers=2, consumed=consumed, epochs=EpochOrder(global_batch=4, seed=2))
        return [ds.to_float(next(loader)) for _ in range(n)]

    run = batches(0, 10)  # 8 batches an epoch: into the second one
    for batch in run:
        rows = batch["index"].tolist()
        expected = torch.utils.data.default_collate([reference[r] for r in rows])
        for key in ("observation.images.front", "observation.images.front_is_pad", "action", "action_is_pad"):
            assert torch.equal(batch[key], expected[key]), key
    assert sum(b["index"].tolist() == list(range(b["index"][0], b["index"][0] + 4)) for b in run) >= 6
    for a, b in zip(batches(12, 7), run[3:]):
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["observation.images.front"],
                                                                   b["observation.images.front"])
