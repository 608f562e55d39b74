"""``RobotDataset``: a map-style dataset over a LeRobot v3.0 or v2.1 directory, items keyed as LeRobot keys them.

An item holds every feature of one frame as torch tensors: numeric features as stored (shape-[1] features as 0-d
tensors), cameras (video or parquet images) as float32 [C, H, W] in [0, 1], plus ``task`` (the string). Keys in
``delta_timestamps`` become windows [T, ...] with a bool ``<key>_is_pad``. ``cameras`` limits the cameras decoded
(a state-only policy need not pay for video).

Loading fast: ``image_dtype="uint8"`` keeps cameras uint8 (a quarter of the bytes to move out of loader workers;
``to_float`` converts a batch to exactly the float32 values), and ``epoch_run`` asks the loader's shuffled epochs
to keep runs of neighbouring rows together, so that a worker decodes the frames their windows share once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from longboat.data.robot.errors import RobotDataError
from longboat.data.robot.frames import FrameColumns
from longboat.data.robot.images import decode_image
from longboat.data.robot.meta import DatasetMeta
from longboat.data.robot.video import VideoFrameReader
from longboat.data.robot.windows import delta_indices, window_rows

VIDEO_BACKENDS = ("pyav",)
IMAGE_DTYPES = ("float32", "uint8")


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
        image_dtype: str = "float32",
        epoch_run: int = 1,
        cache_mb: float = 64,
        meta: DatasetMeta | None = None,
    ):
        """``epoch_run``: rows the loader's shuffled epochs keep together in order (1: each row shuffled alone);
        ``cache_mb``: decoded video frames each process keeps for the windows of the rows that follow; ``meta``:
        the dataset's metadata when already read (``DatasetMeta(root)``), not read and checked again."""
        if video_backend not in VIDEO_BACKENDS:
            raise RobotDataError(f"video_backend {video_backend!r} is not supported (expected one of "
                                 f"{', '.join(VIDEO_BACKENDS)})")
        if image_dtype not in IMAGE_DTYPES:
            raise RobotDataError(f"image_dtype {image_dtype!r} is not supported (expected one of "
                                 f"{', '.join(IMAGE_DTYPES)})")
        if not isinstance(epoch_run, int) or epoch_run < 1:
            raise RobotDataError(f"epoch_run: expected an integer >= 1, got {epoch_run!r}")
        if cache_mb < 0:
            raise RobotDataError(f"cache_mb: expected a size in MiB >= 0, got {cache_mb!r}")
        self.image_dtype, self.epoch_run = image_dtype, epoch_run
        self.meta = meta if meta is not None and meta.root == Path(root) else DatasetMeta(root)
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
        # The video file of each camera and selected episode, as paths built once (building one per frame costs).
        self._video_path = {key: self.meta.video_paths(key, self.positions) for key in self._video_keys}
        self.video = VideoFrameReader(tolerance_s, cache_mb=cache_mb)

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

    def __getitems__(self, rows: Sequence[int]) -> list[dict]:
        """A loader's batch, read in row order: the video decoder runs forward through neighbouring windows."""
        order = sorted(range(len(rows)), key=lambda i: rows[i])
        items: list = [None] * len(rows)
        for i in order:
            items[i] = self[rows[i]]
        return items

    def to_float(self, batch: dict) -> dict:
        """The batch with uint8 cameras as float32 in [0, 1], the values ``image_dtype="float32"`` gives."""
        for key in self.meta.camera_keys:
            if key in batch and batch[key].dtype == torch.uint8:
                batch[key] = batch[key].float().div_(255)
        return batch

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
            item[key] = self._camera(np.stack(imgs), windowed=rows is not None)
        pos = self.positions[ep]
        timestamps = self.frames.numeric["timestamp"]
        for key in self._video_keys:
            rows = rows_of.get(key)
            ts = timestamps[rows] if rows is not None else timestamps[row : row + 1]
            shift = self.meta.episodes.video_start[key][pos]
            path = self._video_path[key][int(pos)]
            frames = self.video.decode(path, [shift + float(t) for t in ts])
            item[key] = self._camera(frames, windowed=rows is not None)
        item["task"] = self.meta.tasks[int(self.frames.numeric["task_index"][row])]
        return item

    def _camera(self, frames: np.ndarray, windowed: bool) -> torch.Tensor:
        """uint8 [T, H, W, C] → [T, C, H, W], as float32 in [0, 1] (LeRobot's convention) unless kept uint8;
        [C, H, W] without a window. Contiguous: a batch of channel-interleaved views would keep their strides through
        collation, and every later operation on its pixels (the float conversion, normalisation) runs ~1.5× slower."""
        t = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()
        if self.image_dtype == "float32":
            t = t.float().div_(255)
        return t if windowed else t[0]
