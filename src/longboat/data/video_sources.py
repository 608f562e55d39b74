"""Captioned video clips for video generators: Wan's ``metadata.csv`` (columns ``video`` and ``prompt``, paths
relative to the csv) or ``.jsonl`` / ``.parquet`` rows naming a clip (a path relative to the file, or its bytes) and
its caption.

A clip is read as ``frames`` frames at ``fps``: frame i is the decoded frame whose presentation time, counted from
the clip's first frame, is nearest t = i / fps (a tie goes to the earlier frame). Times are exact fractions, so
float drift never picks a neighbour. ``frames`` is 1 + 4k, the lengths Wan's VAE compresses 4× in time. Each frame
is scaled, keeping its aspect ratio, until it covers ``height`` × ``width``, then centre-cropped to it.

Every clip's container is probed once when the source opens (frame rate, frame count, size); a clip that cannot be
opened, or is shorter than (frames − 1) / fps, is counted and named, and past ``max_malformed_fraction`` opening
fails. Reading decodes from the clip's start (no seek: the first frame is a keyframe) up to the last frame wanted,
converting to RGB, already scaled, only the frames picked.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Literal

import av
import numpy as np
import torch
from pydantic import Field
from torch.utils.data import Dataset, get_worker_info

from longboat.config.base import ConfigError, StrictModel
from longboat.data.source_files import check_malformed, held_out, read_rows, row_unit
from longboat.errors import LongboatError

METADATA_CSV = "metadata.csv"
TIME_COMPRESSION = 4  # Wan's VAE keeps the first frame and compresses each 4 after it into one latent frame


class VideoSourceConfig(StrictModel):
    source: str = Field(description="Wan's metadata.csv (columns video, prompt) or a .jsonl / .parquet file of rows")
    frames: int = Field(default=81, gt=0, description="frames per clip, 1 + 4k (Wan's VAE compresses time 4×)")
    fps: float | str = Field(default=16, description="frames per second the clip is read at; a number or an exact "
                                                     "fraction such as '30000/1001'")
    height: int = Field(default=480, gt=0, description="frames are scaled to cover height × width, then centre-cropped")
    width: int = Field(default=832, gt=0)
    dtype: Literal["float32", "uint8"] = Field(default="float32",
                                               description="float32: [3, T, H, W] in [-1, 1]; uint8: [T, H, W, 3]")
    valid_fraction: float = Field(default=0.0, ge=0, lt=1, description="share of clips held out for validation")
    split_seed: int = Field(default=0, description="the held-out split's seed")
    max_malformed_fraction: float = Field(default=0.0, ge=0, le=1,
                                          description="share of unreadable or too short clips tolerated (skipped)")
    video_key: str = Field(default="video", description="the clip column (a path or bytes)")
    caption_key: str = Field(default="", description="the caption column; '' for 'prompt' in metadata.csv and "
                                                     "'caption' in rows")


class VideoReadError(LongboatError):
    """A clip that probed well could not be decoded when read."""


@dataclass(frozen=True)
class Clip:
    """A probed clip: where it is (a path or its bytes), what to call it, its caption and its stream's facts."""

    source: Path | bytes
    name: str
    caption: str
    rate: Fraction  # frames per second
    num_frames: int
    width: int
    height: int


def frame_rate(value: float | str) -> Fraction:
    """``fps`` as an exact fraction: 16 -> 16, 29.97 -> 2997/100, '30000/1001' -> 30000/1001."""
    try:
        rate = Fraction(str(value))
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"data.fps: {value!r} is not a number or a fraction such as '30000/1001'") from None
    if rate <= 0:
        raise ConfigError(f"data.fps: {value!r} must be positive")
    return rate


def check_frames(frames: int) -> None:
    """Refuse a frame count Wan's VAE cannot compress: it must be 1 + 4k."""
    if frames % TIME_COMPRESSION != 1:
        below = frames - (frames - 1) % TIME_COMPRESSION
        raise ConfigError(f"data.frames: {frames} is not 1 + 4k (Wan's VAE compresses time 4× after the first frame); "
                          f"use {below if below >= 1 else 1} or {below + TIME_COMPRESSION}")


def pick_times(frames: int, fps: Fraction) -> list[Fraction]:
    """The times frame i is wanted at, i / fps, exactly."""
    return [Fraction(i) / fps for i in range(frames)]


def cover_size(width: int, height: int, out_w: int, out_h: int) -> tuple[int, int]:
    """(w, h) of a ``width`` × ``height`` frame scaled, keeping its aspect, to cover ``out_w`` × ``out_h``."""
    scale = max(Fraction(out_w, width), Fraction(out_h, height))
    return max(out_w, round(width * scale)), max(out_h, round(height * scale))


def _open(source: Path | bytes) -> av.container.InputContainer:
    return av.open(io.BytesIO(source) if isinstance(source, bytes) else str(source))


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def probe(source: Path | bytes, name: str, caption: str) -> Clip:
    """The clip's frame rate, frame count and size from its container, without decoding; ``ValueError`` naming
    why when it cannot be opened."""
    try:
        with _open(source) as container:
            if not container.streams.video:
                raise ValueError("no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate
            if not rate:
                raise ValueError("no frame rate")
            count = stream.frames
            if not count:  # containers that do not count frames: from the duration
                if stream.duration is not None:
                    duration = stream.duration * stream.time_base
                elif container.duration is not None:
                    duration = Fraction(container.duration, av.time_base)
                else:
                    raise ValueError("neither a frame count nor a duration")
                count = int(duration * rate)
            ctx = stream.codec_context
            if not ctx.width or not ctx.height:
                raise ValueError("no frame size")
            return Clip(source, name, caption, Fraction(rate), int(count), ctx.width, ctx.height)
    except (av.error.FFmpegError, OSError) as e:
        raise ValueError(_one_line(e)) from None


def decode_clip(clip: Clip, times: list[Fraction], width: int, height: int, threads: bool = True) -> np.ndarray:
    """uint8 RGB [T, H, W, 3]: for each of ``times`` (ascending, seconds from the clip's first frame) the frame
    nearest it, scaled to cover ``width`` × ``height`` and centre-cropped."""
    out = np.empty((len(times), height, width, 3), dtype=np.uint8)
    cover_w, cover_h = cover_size(clip.width, clip.height, width, height)
    top, left = (cover_h - height) // 2, (cover_w - width) // 2
    filled: dict[int, int] = {}  # a frame's pts -> the first row it filled: a frame picked twice is converted once

    def put(frame: av.VideoFrame, row: int) -> None:
        first = filled.setdefault(frame.pts, row)
        if first != row:
            out[row] = out[first]
            return
        # swscale's bilinear widens its filter when shrinking, so it does not alias; bicubic costs ~1.5× more.
        rgb = frame.to_ndarray(format="rgb24", width=cover_w, height=cover_h, interpolation="BILINEAR")
        out[row] = rgb[top:top + height, left:left + width]

    done, previous, previous_ts = 0, None, Fraction(0)
    try:
        with _open(clip.source) as container:
            stream = container.streams.video[0]
            if threads:
                stream.thread_type = "AUTO"
            origin = None
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                origin = frame.pts if origin is None else origin
                ts = (frame.pts - origin) * stream.time_base
                while done < len(times) and times[done] <= ts:
                    t = times[done]  # between the previous frame and this one: the nearer, the earlier on a tie
                    put(previous if previous is not None and t - previous_ts <= ts - t else frame, done)
                    done += 1
                if done == len(times):
                    break
                previous, previous_ts = frame, ts
    except av.error.FFmpegError as e:
        raise VideoReadError(f"{clip.name}: decoding failed ({_one_line(e)})") from None
    if done < len(times):  # wanted past the last frame: it is the nearest while within half a frame
        if previous is None or times[-1] - previous_ts > Fraction(1, 2) / clip.rate:
            last = "no frame" if previous is None else f"the last frame at {float(previous_ts):.3f} s"
            raise VideoReadError(f"{clip.name}: read up to {float(times[-1]):.3f} s but decoding gave {last} "
                                 "(shorter than its container says?)")
        for row in range(done, len(times)):
            put(previous, row)
    return out


@dataclass
class VideoClips(Dataset):
    """The readable clips of a source; item i is ``{"video": clip i, "caption": its caption}``, the clip as
    ``cfg.dtype`` says: float32 [3, T, H, W] in [-1, 1] (channels first, as images and the VAE take them) or the
    decoded uint8 [T, H, W, 3]."""

    clips: list[Clip]
    cfg: VideoSourceConfig
    malformed: list[str] = field(default_factory=list)  # what could not be read or was too short (skipped)

    def __post_init__(self) -> None:
        self.times = pick_times(self.cfg.frames, frame_rate(self.cfg.fps))

    def __len__(self) -> int:
        return len(self.clips)

    @property
    def captions(self) -> list[str]:
        return [clip.caption for clip in self.clips]

    def subset(self, index: torch.Tensor) -> VideoClips:
        return VideoClips([self.clips[i] for i in index.tolist()], self.cfg, self.malformed)

    def frames(self, i: int) -> np.ndarray:
        """Clip i's frames, uint8 [T, H, W, 3]."""
        # Loader workers are the parallelism; decoder threads in each would oversubscribe the cores.
        return decode_clip(self.clips[i], self.times, self.cfg.width, self.cfg.height, get_worker_info() is None)

    def __getitem__(self, i: int) -> dict:
        frames = self.frames(i)
        if self.cfg.dtype == "uint8":
            return {"video": torch.from_numpy(frames), "caption": self.clips[i].caption}
        return {"video": to_float(frames), "caption": self.clips[i].caption}


def to_float(frames: np.ndarray) -> torch.Tensor:
    """uint8 [T, H, W, 3] -> float32 [3, T, H, W] in [-1, 1]: one converting copy, then scaled in place."""
    out = torch.empty((3, *frames.shape[:3]), dtype=torch.float32)
    out.copy_(torch.from_numpy(frames).permute(3, 0, 1, 2))
    return out.mul_(1 / 127.5).sub_(1)


def _csv_rows(path: Path) -> list[dict]:
    try:
        with path.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"data.source: {path}: not a readable csv ({_one_line(e)})") from None


def _locate(value, path: Path, unit: str, number: int) -> tuple[Path | bytes | None, str]:
    """A row's clip (a path relative to ``path``'s folder, or bytes) and the name messages give it."""
    if isinstance(value, dict) and "bytes" in value:  # datasets' Video feature as parquet stores it
        value = value["bytes"] if value["bytes"] is not None else value.get("path")
    if isinstance(value, str) and value:
        return path.parent / value, f"{path.parent / value} ({unit} {number})"
    if isinstance(value, (bytes, bytearray)) and value:
        return bytes(value), f"{path} {unit} {number}"
    return None, f"{path} {unit} {number}"


def open_clips(cfg: VideoSourceConfig) -> VideoClips:
    """Every clip of ``cfg.source``, probed; those unreadable or too short counted and named."""
    check_frames(cfg.frames)
    fps = frame_rate(cfg.fps)
    path = Path(cfg.source)
    if not path.is_file():
        raise ConfigError(f"data.source: {cfg.source}: no such file (expected Wan's {METADATA_CSV} or a .jsonl / "
                          ".parquet file of rows)")
    if path.name.endswith(".csv"):
        rows, unit, caption_key = _csv_rows(path), "line", cfg.caption_key or "prompt"
        number_base = 2  # line 1 is the header
    elif path.name.endswith((".jsonl", ".parquet")):
        rows, unit, caption_key = read_rows(path), row_unit(path), cfg.caption_key or "caption"
        number_base = 1
    else:
        raise ConfigError(f"data.source: {cfg.source}: expected Wan's {METADATA_CSV} (or another .csv with its "
                          "columns) or a .jsonl / .parquet file of rows")
    for number, row in enumerate(rows, number_base):
        if cfg.video_key not in row:
            raise ConfigError(f"data.source: {path} {unit} {number} has no '{cfg.video_key}' (data.video_key); "
                              f"columns: {', '.join(row) or 'none'}")
    span = Fraction(cfg.frames - 1) / fps
    clips, bad = [], []
    for number, row in enumerate(rows, number_base):
        source, name = _locate(row[cfg.video_key], path, unit, number)
        try:
            if source is None:
                raise ValueError("no clip")
            clip = probe(source, name, str(row.get(caption_key) or ""))
        except ValueError as e:
            bad.append(f"{name}: {e}")
            continue
        last = Fraction(clip.num_frames - 1) / clip.rate
        if last < span:
            bad.append(f"{name}: too short, {clip.num_frames} frames at {float(clip.rate):g} fps end at "
                       f"{float(last):g} s, reading {cfg.frames} at {float(fps):g} fps needs {float(span):g} s")
            continue
        clips.append(clip)
    check_malformed(bad, len(rows), cfg.max_malformed_fraction, str(path), "clips", "cannot be read or are too short")
    return VideoClips(clips, cfg, bad)


def open_video_split(cfg: VideoSourceConfig) -> tuple[VideoClips, VideoClips | None]:
    """(train, valid) clips of ``cfg.source``; valid is None when ``valid_fraction`` is 0."""
    clips = open_clips(cfg)
    if cfg.valid_fraction == 0:
        return clips, None
    train, valid = held_out(len(clips), cfg.valid_fraction, cfg.split_seed, cfg.source, "clips")
    return clips.subset(train), clips.subset(valid)
