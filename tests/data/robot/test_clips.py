"""``longboat data clips``: a LeRobot dataset's camera cut into captioned clips that ``data/video_sources.py`` reads
back as the dataset's own frames at the chosen rate; bad input in one line."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from longboat.cli.main import main
from longboat.data.robot import RobotDataset
from longboat.data.robot.clips import clip_starts, export_clips, resize_cover
from longboat.data.video_sources import VideoSourceConfig, open_clips


def test_clip_starts_fit_whole_clips_in_an_episode():
    assert clip_starts(12, 8, 8) == [0]
    assert clip_starts(15, 8, 4) == [0, 4]
    assert clip_starts(8, 8, 8) == []  # the last frame would be row 8 of 0..7


def test_clips_are_the_episodes_frames_at_the_chosen_rate(written, tmp_path):
    root, _ = written
    out = tmp_path / "clips"
    counts = export_clips(root, out, "observation.images.front", frames=5, fps=5, size=16, every=0.4)
    assert counts == {"episodes": 3, "clips": 3, "tasks": 1, "camera": "observation.images.front"}
    with (out / "metadata.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["episode_index"], r["start_s"], r["prompt"]) for r in rows] == [
        ("0", "0", "reach"), ("2", "0", "reach"), ("2", "0.4", "reach")]  # episode 1 is too short (7 frames)
    clips = open_clips(VideoSourceConfig(source=str(out / "metadata.csv"), frames=5, fps=5, height=16, width=16,
                                         dtype="uint8"))
    assert len(clips) == 3 and clips.captions == ["reach"] * 3
    data = RobotDataset(root, cameras=["observation.images.front"], image_dtype="uint8")
    first_of_episode_2 = 12 + 7
    want = np.stack([resize_cover(data[first_of_episode_2 + 4 + 2 * k]["observation.images.front"]
                                  .permute(1, 2, 0).numpy(), 16) for k in range(5)])
    got = clips[2]["video"].numpy()
    assert got.shape == (5, 16, 16, 3)
    assert np.abs(got.astype(int) - want.astype(int)).mean() < 4  # H.264 at crf 12 keeps it close
    other = clips[1]["video"].numpy()  # a clip 0.4 s earlier differs: the pattern moves
    assert np.abs(other.astype(int) - want.astype(int)).mean() > 4 * np.abs(got.astype(int) - want.astype(int)).mean()
    assert torch.equal(torch.from_numpy(got), torch.from_numpy(clips[2]["video"].numpy()))


@pytest.mark.parametrize("args, message", [
    (["--frames", "6"], "data.frames: 6 is not 1 + 4k"),
    (["--fps", "20"], "--fps 20: above the dataset's 10 frames per second"),
    (["--camera", "observation.state"], "'observation.state' is not a camera"),
    (["--frames", "41"], "no episode is long enough for one clip of 41 frames at 5 fps (8 s)"),
])
def test_bad_input_is_one_line(written, tmp_path, capsys, args, message):
    root, _ = written
    assert main(["data", "clips", str(root), str(tmp_path / "o"), "--fps", "5", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "o").exists()
