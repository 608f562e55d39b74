"""Write → read round trips: non-video features bit for bit, video within codec tolerance, LeRobot's layout."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from longboat.data.robot import RobotDataError, RobotDataset, RobotDatasetWriter
from tests.data.robot.conftest import FEATURES, FPS, LENGTHS, make_frames, task_of, write_dataset

EXACT = ("observation.state", "next.reward", "next.done", "action")


def flat(episodes):
    return [(ep, t, f) for ep, frames in enumerate(episodes) for t, f in enumerate(frames)]


@pytest.mark.parametrize("which", ["written", "written_h264"])
def test_round_trip(which, request):
    root, episodes = request.getfixturevalue(which)
    ds = RobotDataset(root)
    rows = flat(episodes)
    assert len(ds) == len(rows)
    worst = 0.0
    sources = [f["observation.images.front"].astype(np.float32) for _, _, f in rows]
    for i, (ep, t, frame) in enumerate(rows):
        item = ds[i]
        for key in EXACT:
            got = item[key].numpy()
            want = np.asarray(frame[key])
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (i, key)
        assert item["next.reward"].shape == ()  # shape [1] features are scalars, as LeRobot stores them
        wrist = np.round(item["observation.images.wrist"].numpy() * 255).astype(np.uint8).transpose(1, 2, 0)
        assert np.array_equal(wrist, frame["observation.images.wrist"])  # PNG is lossless
        assert (item["episode_index"].item(), item["frame_index"].item(), item["index"].item()) == (ep, t, i)
        assert item["timestamp"].item() == pytest.approx(t / FPS) and item["task"] == task_of(ep, t)
        front = item["observation.images.front"].numpy().transpose(1, 2, 0) * 255
        errors = [float(np.abs(front - sources[j]).mean()) for j in range(max(i - 1, 0), min(i + 2, len(rows)))]
        own = errors[min(i, 1)]
        assert own == min(errors), f"frame {i} decodes closer to a neighbour: {errors}"
        worst = max(worst, own)
    # Lossy 4:2:0 at crf 30 on a 48×32 image; neighbouring frames differ by 8+ grey levels on average.
    assert worst < 6, f"mean absolute error {worst:.2f} grey levels"


def test_layout(written):
    root, _ = written
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS and info["robot_type"] == "toy_arm"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, sum(LENGTHS), 2)
    assert info["splits"] == {"train": "0:3"} and info["chunks_size"] == 1000
    video = info["features"]["observation.images.front"]["info"]
    assert (video["video.codec"], video["video.pix_fmt"], video["video.height"], video["video.width"]) == \
        ("av1", "yuv420p", 32, 48)
    for key in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert key in info["features"]
    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    assert str(data.schema.field("observation.state").type) == "fixed_size_list<element: float>[5]"
    assert str(data.schema.field("next.reward").type) == "float"
    assert "observation.images.front" not in data.column_names
    eps = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["length"] for e in eps] == list(LENGTHS)
    assert [e["dataset_from_index"] for e in eps] == [0, 12, 19]
    starts = [e["videos/observation.images.front/from_timestamp"] for e in eps]
    ends = [e["videos/observation.images.front/to_timestamp"] for e in eps]
    assert starts == pytest.approx([0, 1.2, 1.9]) and ends == pytest.approx([1.2, 1.9, 3.4])
    assert eps[2]["tasks"] == ["reach", "grasp"]  # in order of first appearance
    assert np.asarray(eps[0]["stats/observation.images.front/mean"]).shape == (3, 1, 1)
    tasks = pq.read_table(root / "meta/tasks.parquet")  # a pandas frame whose index is the task strings
    index = json.loads(tasks.schema.metadata[b"pandas"])["index_columns"]
    assert dict(zip(tasks.column(index[0]).to_pylist(), tasks.column("task_index").to_pylist())) == \
        {"reach": 0, "grasp": 1}
    assert not any(p.name.startswith(".ds.partial") for p in root.parent.iterdir())


def test_files_roll_over_by_size(tmp_path):
    episodes = make_frames(seed=2, lengths=(25, 25, 25))  # long enough for the AV1 encoder's lookahead
    root = write_dataset(tmp_path / "ds", episodes, data_files_size_in_mb=0.0001, video_files_size_in_mb=0.0001)
    assert len(list((root / "data/chunk-000").glob("*.parquet"))) == 3
    assert len(list((root / "videos/observation.images.front/chunk-000").glob("*.mp4"))) == 3
    ds = RobotDataset(root, delta_timestamps={"observation.images.front": [-0.1, 0]})
    assert ds.meta.episodes.video_start["observation.images.front"].tolist() == [0, 0, 0]
    rows = flat(episodes)
    for i in (0, 25, 74):
        assert np.array_equal(ds[i]["observation.state"].numpy(), rows[i][2]["observation.state"])
        assert ds[i]["observation.images.front"].shape == (2, 3, 32, 48)


def test_error_keeps_saved_episodes(tmp_path):
    episodes = make_frames(seed=3, lengths=(4, 4))
    root = tmp_path / "ds"
    with pytest.raises(RuntimeError, match="recorder failed"):
        with RobotDatasetWriter(root, FPS, FEATURES) as writer:
            for frame in episodes[0]:
                writer.add_frame(frame, task="reach")
            writer.save_episode()
            writer.add_frame(episodes[1][0], task="reach")
            assert not root.exists()  # nothing at the target until the writer closes
            raise RuntimeError("recorder failed")
    ds = RobotDataset(root)
    assert len(ds) == 4 and ds.num_episodes == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_error_before_any_episode_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with RobotDatasetWriter(tmp_path / "ds", FPS, FEATURES) as writer:
            writer.add_frame(make_frames(lengths=(1,))[0][0], task="reach")
            raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []


KILLED_WRITER = """
import os, signal, sys
from longboat.data.robot import RobotDatasetWriter
from tests.data.robot.conftest import FEATURES, FPS, make_frames
w = RobotDatasetWriter(sys.argv[1], FPS, FEATURES)
for frame in make_frames(lengths=(3,))[0]:
    w.add_frame(frame, task="reach")
w.save_episode()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_killed_writer_leaves_no_target(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "ds")], capture_output=True,
                          cwd=os.getcwd(), timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert not (tmp_path / "ds").exists()


def test_bad_frames_fail_naming_the_feature(tmp_path):
    frame = make_frames(lengths=(1,))[0][0]
    with RobotDatasetWriter(tmp_path / "ds", FPS, FEATURES) as writer:
        with pytest.raises(RobotDataError, match=r"'observation.state': expected shape \[5\], got \[4\]"):
            writer.add_frame({**frame, "observation.state": np.zeros(4, np.float32)}, task="t")
        with pytest.raises(RobotDataError, match=r"missing features \['action'\]"):
            writer.add_frame({k: v for k, v in frame.items() if k != "action"}, task="t")
        with pytest.raises(RobotDataError, match="'observation.images.front': expected uint8"):
            writer.add_frame({**frame, "observation.images.front": np.zeros((3, 3, 3), np.uint8)}, task="t")
        with pytest.raises(RobotDataError, match="save_episode with no frames"):
            writer.save_episode()
        writer.add_frame(frame, task="t")
        writer.save_episode()
    with pytest.raises(RobotDataError, match="already exists"):
        RobotDatasetWriter(tmp_path / "ds", FPS, FEATURES)


def test_float_chw_images_are_accepted(tmp_path):
    frame = make_frames(lengths=(2,))[0]
    with RobotDatasetWriter(tmp_path / "ds", FPS, FEATURES) as writer:
        for f in frame:
            chw = f["observation.images.wrist"].transpose(2, 0, 1).astype(np.float32) / 255
            writer.add_frame({**f, "observation.images.wrist": chw}, task="t")
        writer.save_episode()
    got = RobotDataset(tmp_path / "ds")[1]["observation.images.wrist"].numpy()
    assert np.array_equal(np.round(got * 255).astype(np.uint8).transpose(1, 2, 0), frame[1]["observation.images.wrist"])
