"""A small dataset written by our writer: a video camera, a parquet image camera, vectors and a scalar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from longboat.data.robot import RobotDatasetWriter, VideoOptions

FPS = 10
LENGTHS = (12, 7, 15)
H, W = 32, 48
FEATURES = {
    "observation.images.front": {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"]},
    "observation.images.wrist": {"dtype": "image", "shape": [16, 24, 3], "names": ["height", "width", "channels"]},
    "observation.state": {"dtype": "float32", "shape": [5], "names": None},
    "next.reward": {"dtype": "float32", "shape": [1], "names": None},
    "next.done": {"dtype": "bool", "shape": [1], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
}
TASKS = ("reach", "grasp")


def smooth_frame(episode: int, t: int) -> np.ndarray:
    """A smooth moving pattern: lossy codecs keep it within a few grey levels."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    img = np.stack([128 + 100 * np.sin((x + 2 * t) / 9), 128 + 100 * np.cos((y + 3 * episode) / 7),
                    np.full_like(x, 40.0 + 10 * t)], -1)
    return np.clip(img, 0, 255).astype(np.uint8)


def make_frames(seed: int = 0, lengths=LENGTHS) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    episodes = []
    for ep, n in enumerate(lengths):
        frames = []
        for t in range(n):
            frames.append({
                "observation.images.front": smooth_frame(ep, t),
                "observation.images.wrist": rng.integers(0, 256, (16, 24, 3), dtype=np.uint8),
                "observation.state": rng.normal(size=5).astype(np.float32),
                "next.reward": np.float32(rng.normal()),
                "next.done": np.bool_(t == n - 1),
                "action": rng.normal(size=2).astype(np.float32),
            })
        episodes.append(frames)
    return episodes


def task_of(ep: int, t: int) -> str:
    return TASKS[1] if ep == 2 and t >= 5 else TASKS[ep % 2]


def write_dataset(root: Path, episodes: list[list[dict]], **kwargs) -> Path:
    with RobotDatasetWriter(root, FPS, FEATURES, robot_type="toy_arm", **kwargs) as writer:
        for ep, frames in enumerate(episodes):
            for t, frame in enumerate(frames):
                writer.add_frame(frame, task=task_of(ep, t))
            writer.save_episode()
    return root


@pytest.fixture(scope="session")
def written(tmp_path_factory) -> tuple[Path, list[list[dict]]]:
    episodes = make_frames()
    return write_dataset(tmp_path_factory.mktemp("robot") / "ds", episodes), episodes


@pytest.fixture(scope="session")
def written_h264(tmp_path_factory) -> tuple[Path, list[list[dict]]]:
    episodes = make_frames(seed=1, lengths=(6, 9))
    root = write_dataset(tmp_path_factory.mktemp("robot") / "ds", episodes, video=VideoOptions(codec="h264"))
    return root, episodes
