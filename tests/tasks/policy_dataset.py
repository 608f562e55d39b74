"""A tiny robot dataset a policy can learn: smooth trajectories whose next state is the action.

Each episode follows its own phase, written into the state, so the whole action chunk is a function of the
current state; a parquet image camera (cheap to decode) shows a pattern that moves with the phase.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from longboat.data.robot import RobotDatasetWriter

FPS = 10
STATE, ACTION = 4, 2
IMAGE = (12, 16)  # height, width
TASKS = ("reach the target", "push the block")


def _camera_keys(camera_key: str | Sequence[str]) -> tuple[str, ...]:
    return (camera_key,) if isinstance(camera_key, str) else tuple(camera_key)


def features(camera: bool, camera_key: str | Sequence[str] = "observation.images.top",
             image: tuple[int, int] = IMAGE) -> dict:
    out = {
        "observation.state": {"dtype": "float32", "shape": [STATE], "names": None},
        "action": {"dtype": "float32", "shape": [ACTION], "names": ["dx", "dy"]},
    }
    if camera:
        for key in _camera_keys(camera_key):
            out[key] = {"dtype": "image", "shape": [*image, 3], "names": ["height", "width", "channels"]}
    return out


def state_at(episode: int, t: int) -> np.ndarray:
    phase = 0.7 * episode
    angle = 0.3 * t + phase
    return np.array([np.sin(angle), np.cos(angle), np.sin(phase), np.cos(phase)], dtype=np.float32) * [2, 1, 1, 1]


def image_at(episode: int, t: int, image: tuple[int, int] = IMAGE) -> np.ndarray:
    y, x = np.mgrid[0:image[0], 0:image[1]].astype(np.float64)
    angle = 0.3 * t + 0.7 * episode
    img = np.stack([128 + 100 * np.sin(x / 3 + angle), 128 + 100 * np.cos(y / 3 - angle), np.full_like(x, 90)], -1)
    return img.astype(np.uint8)


def write_policy_dataset(root: str | Path, episodes: int = 6, length: int = 20, camera: bool = True,
                         camera_key: str | Sequence[str] = "observation.images.top",
                         image: tuple[int, int] = IMAGE) -> Path:
    """``camera_key``: one camera, or several showing the same pattern."""
    with RobotDatasetWriter(root, FPS, features(camera, camera_key, image), robot_type="toy_arm") as writer:
        for ep in range(episodes):
            for t in range(length):
                frame = {"observation.state": state_at(ep, t), "action": state_at(ep, t + 1)[:ACTION]}
                if camera:
                    for key in _camera_keys(camera_key):
                        frame[key] = image_at(ep, t, image)
                writer.add_frame(frame, task=TASKS[ep % 2])
            writer.save_episode()
    return Path(root)
