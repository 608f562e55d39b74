"""``RobotDataset``: a map-style dataset over a LeRobot v3.0 or v2.1 directory, items keyed as LeRobot keys them.

An item holds every feature of one frame as torch tensors: numeric features as stored (shape-[1] features as 0-d
tensors), cameras (video or parquet images) as float32 [C, H, W] in [0, 1], plus ``task`` (the string). Keys in
``delta_timestamps`` become windows [T, ...] with a bool ``<key>_is_pad``. ``cameras`` limits the cameras decoded
(a state-only policy need not pay for video).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from longboat.data.robot.errors import RobotDataError, VideoDecodeError
from longboat.data.robot.frames import FrameColumns
from longboat.data.robot.images import decode_image
from longboat.data.robot.meta import DatasetMeta
from longboat.data.robot.video import VideoFrameReader
from longboat.data.robot.windows import delta_indices, window_rows

VIDEO_BACKENDS = ("pyav",)


class RobotDataset(Dataset):
    """Frames of the chosen ``episodes`` (all by default) of the LeRobot dataset at ``root``."""

    def __init__(
        self,
        root: str | Path,
        delta_timestamps: dict[str, Sequence[float]] | None = None,
        episodes: Sequence[int] | None = None,
        video_backend: str = "pyav",
        tolerance_s: float = 1e-4,
        cameras: Sequence[str] | None = None,
    ):
        if video_backend not in VIDEO_BACKENDS:
            raise RobotDataError(f"video_backend {video_backend!r} is not supported (expected one of "
                                 f"{', '.join(VIDEO_BACKENDS)})")
        self.meta = DatasetMeta(root)
        self.root = self.meta.root
        self.tolerance_s = tolerance_s
        self.delta_timestamps = {k: list(v) for k, v in (delta_timestamps or {}).items()}
        for key in self.delta_timestamps:
            self.meta.feature(key)
        self.cameras = list(self.meta.camera_keys if cameras is None else cameras)
        for key in self.cameras:
            if not self.meta.feature(key).is_visual:
                raise RobotDataError(f"{self.root}: '{key}' is not a camera (cameras: "
                                     f"{', '.join(self.meta.camera_keys) or 'none'})")
        self.delta_indices = delta_indices(self.delta_timestamps, self.meta.fps, tolerance_s)
        self.positions = self._select(episodes)
        self._video_keys = [k for k in self.meta.video_keys if k in self.cameras]
        self.frames = FrameColumns(self.meta, self.positions)
        # Row range of each selected episode within this dataset's rows.
        lengths = self.meta.episodes.length[self.positions]
        self._ep_end = np.cumsum(lengths)
        self._ep_start = self._ep_end - lengths
        self._row_episode = np.repeat(np.arange(len(self.positions)), lengths)
        for key in self._video_keys:  # a missing file fails now, not in a loader worker hours later
            for rel in dict.fromkeys(self.meta.episodes.video_file[key][p] for p in self.positions):
                if not (self.root / rel).is_file():
                    raise VideoDecodeError(f"{self.root / rel}: video file of '{key}' not found")
        self.video = VideoFrameReader(tolerance_s)

    def _select(self, episodes: Sequence[int] | None) -> np.ndarray:
        eps = self.meta.episodes
        if episodes is None:
            return np.arange(len(eps.index))
        out = []
        for e in episodes:
            try:
                out.append(eps.position(int(e)))
            except KeyError:
                raise RobotDataError(f"{self.root}: episode {e} does not exist (episodes "
                                     f"{eps.index.min()}..{eps.index.max()})") from None
        if len(set(out)) != len(out):
            raise RobotDataError(f"{self.root}: episodes {list(episodes)} lists an episode twice")
        return np.sort(np.asarray(out, dtype=np.int64))

    @property
    def fps(self) -> float:
        return self.meta.fps

    @property
    def features(self) -> dict:
        return self.meta.features

    @property
    def episode_indices(self) -> list[int]:
        return self.meta.episodes.index[self.positions].tolist()

    @property
    def num_episodes(self) -> int:
        return len(self.positions)

    def __len__(self) -> int:
        return self.frames.num_rows

    def __getitem__(self, row: int) -> dict:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range for {len(self)} frames")
        ep = self._row_episode[row]
        start, end = int(self._ep_start[ep]), int(self._ep_end[ep])
        item: dict = {}
        rows_of: dict[str, np.ndarray] = {}
        for key, deltas in self.delta_indices.items():
            rows, pad = window_rows(row, start, end, deltas)
            rows_of[key] = rows
            item[f"{key}_is_pad"] = torch.from_numpy(pad)
        for key, values in self.frames.numeric.items():
            item[key] = torch.from_numpy(np.array(values[rows_of.get(key, row)]))
        for key, values in self.frames.strings.items():
            item[key] = values[row]
        for key, column in self.frames.images.items():
            if key not in self.cameras:
                continue
            rows = rows_of.get(key)
            imgs = [decode_image(column, int(r), self.root, key) for r in (rows if rows is not None else [row])]
            item[key] = _to_chw_float(np.stack(imgs), windowed=rows is not None)
        pos = self.positions[ep]
        timestamps = self.frames.numeric["timestamp"]
        for key in self._video_keys:
            rows = rows_of.get(key)
            ts = timestamps[rows] if rows is not None else timestamps[row : row + 1]
            shift = self.meta.episodes.video_start[key][pos]
            path = self.root / self.meta.episodes.video_file[key][pos]
            frames = self.video.decode(path, [shift + float(t) for t in ts])
            item[key] = _to_chw_float(frames, windowed=rows is not None)
        item["task"] = self.meta.tasks[int(self.frames.numeric["task_index"][row])]
        return item


def _to_chw_float(frames: np.ndarray, windowed: bool) -> torch.Tensor:
    """uint8 [T, H, W, C] → float32 [T, C, H, W] in [0, 1] (LeRobot's convention), [C, H, W] without a window."""
    t = torch.from_numpy(frames).permute(0, 3, 1, 2).float().div_(255)
    return t if windowed else t[0]
