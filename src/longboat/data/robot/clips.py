"""A LeRobot dataset's camera cut into captioned clips in Wan's ``metadata.csv`` layout (``longboat data clips``):
what ``data.source: video`` trains a video generator on.

Each episode yields clips of ``frames`` frames at ``fps`` (frame k of a clip starting at row s is the row nearest
s + k·dataset_fps/fps), a new clip starting every ``every`` seconds (default: one clip's span, so neighbours share
their boundary frame); an episode too short for one clip yields none. Frames are scaled to cover ``size`` × ``size``
and centre-cropped, written as H.264 mp4 (4:4:4, colour kept whole) at ``fps``, and captioned by the episode's task string. ``metadata.csv``
lists ``video`` (relative to it), ``prompt``, and where each clip came from (``episode_index``, ``start_s``).
"""

from __future__ import annotations

import csv
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

from longboat.data.clip_writer import write_mp4
from longboat.data.robot.dataset import RobotDataset
from longboat.data.robot.errors import RobotDataError
from longboat.data.video_sources import METADATA_CSV, check_frames, cover_size, frame_rate
from longboat.utils.outputs import staged_output


def resize_cover(frame: np.ndarray, size: int) -> np.ndarray:
    """uint8 [H, W, 3] scaled (area-averaged when shrinking) to cover ``size`` × ``size``, centre-cropped."""
    h, w = frame.shape[:2]
    cw, ch = cover_size(w, h, size, size)
    image = Image.fromarray(frame).resize((cw, ch), Image.Resampling.BOX if cw <= w else Image.Resampling.BILINEAR)
    top, left = (ch - size) // 2, (cw - size) // 2
    return np.asarray(image)[top:top + size, left:left + size]


def clip_starts(length: int, span_rows: float, every_rows: float) -> list[int]:
    """The first rows of the clips an episode of ``length`` rows holds."""
    starts, s = [], 0.0
    while round(s) + round(span_rows) < length:
        starts.append(round(s))
        s += every_rows
    return starts


def export_clips(dataset: str | Path, out: str | Path, camera: str | None = None, frames: int = 9,
                 fps: float | str = 5, size: int = 32, every: float | None = None, overwrite: bool = False) -> dict:
    """Write ``out``/clips/*.mp4 and ``out``/metadata.csv; returns counts (episodes, clips, tasks)."""
    check_frames(frames)
    rate = frame_rate(fps)
    if size < 2:
        raise RobotDataError(f"--size: {size} is too small (at least 2)")
    data = RobotDataset(dataset, cameras=[camera] if camera else None, image_dtype="uint8")
    if camera is None:
        if not data.cameras:
            raise RobotDataError(f"{dataset}: the dataset has no camera")
        camera = data.cameras[0]
    source_fps = Fraction(str(data.fps))
    if rate > source_fps:
        raise RobotDataError(f"--fps {fps}: above the dataset's {data.fps:g} frames per second")
    step = source_fps / rate  # dataset rows per clip frame
    every_rows = (Fraction(str(every)) * source_fps) if every is not None else step * (frames - 1)
    if every_rows <= 0:
        raise RobotDataError(f"--every {every}: must be positive")
    rows, tasks = [], set()
    with staged_output(out, overwrite, [dataset]) as stage:
        (stage / "clips").mkdir()
        ends = np.cumsum(data.meta.episodes.length[data.positions]).tolist()
        for episode, start, end in zip(data.episode_indices, [0] + ends[:-1], ends):
            for s in clip_starts(end - start, float(step * (frames - 1)), float(every_rows)):
                items = [data[start + s + round(k * step)] for k in range(frames)]
                picked = np.stack([resize_cover(item[camera].permute(1, 2, 0).numpy(), size) for item in items])
                name = f"clips/episode_{episode:06d}_{s:05d}.mp4"
                write_mp4(stage / name, picked, rate, full_colour=True)
                task = items[0]["task"]
                tasks.add(task)
                rows.append({"video": name, "prompt": task, "episode_index": episode,
                             "start_s": f"{float(Fraction(s) / source_fps):g}"})
        if not rows:
            raise RobotDataError(f"{dataset}: no episode is long enough for one clip of {frames} frames at "
                                 f"{float(rate):g} fps ({float((frames - 1) / rate):g} s)")
        with (stage / METADATA_CSV).open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, ["video", "prompt", "episode_index", "start_s"])
            writer.writeheader()
            writer.writerows(rows)
    return {"episodes": data.num_episodes, "clips": len(rows), "tasks": len(tasks), "camera": camera}
