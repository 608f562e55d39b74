"""Captioned clips for the diffusion task (``data.source: video``): the ``data.video`` settings, the (train, valid)
clips of ``data/video_sources.py``, and the positioned samples the loss reads, each clip float [3, T, H, W] in
[-1, 1] under the key ``image`` (what the loss calls the clean sample, image or clip).

A clip is decoded the first time a process reads it and kept as uint8 (3·T·H·W bytes: 27 KiB for 9 frames of
32×32), so later epochs cost no decoding; a source too large to keep sets ``keep_decoded: false``.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field, field_validator
from torch.utils.data import Dataset

from longboat.config.base import StrictModel
from longboat.data.video_sources import TIME_COMPRESSION, VideoClips, frame_rate, VideoSourceConfig, open_video_split, to_float
from longboat.models.generative.keyed_random import noise_key


class ClipSettings(StrictModel):
    """Where the clips are and how they are read (``data/video_sources.py``)."""

    path: str = Field(description="Wan's metadata.csv (columns video, prompt) or a .jsonl / .parquet file of rows "
                                  "(`longboat data clips` writes a metadata.csv from a robot dataset)")
    frames: int = Field(default=9, gt=0, description="frames per clip, 1 + 4k")
    fps: float | str = Field(default=8, description="frames per second the clips are read at ('30000/1001' works)")
    size: int = Field(default=32, gt=0, description="frames are scaled to cover size × size, then centre-cropped")
    max_malformed_fraction: float = Field(default=0.0, ge=0, le=1,
                                          description="share of unreadable or too short clips tolerated (skipped)")
    video_key: str = Field(default="video", description="the clip column (a path or bytes)")
    caption_key: str = Field(default="", description="the caption column; '' for 'prompt' in metadata.csv and "
                                                     "'caption' in rows")
    keep_decoded: bool = Field(default=True, description="keep each decoded clip in memory (uint8) for later epochs")

    @field_validator("frames")
    @classmethod
    def _one_plus_4k(cls, frames: int) -> int:
        if frames % TIME_COMPRESSION != 1:
            raise ValueError(f"{frames} is not 1 + 4k (Wan's VAE compresses time 4× after the first frame); use "
                             f"{frames - (frames - 1) % TIME_COMPRESSION} or "
                             f"{frames - (frames - 1) % TIME_COMPRESSION + TIME_COMPRESSION}")
        return frames


def source_config(video: ClipSettings, valid_fraction: float, split_seed: int) -> VideoSourceConfig:
    return VideoSourceConfig(source=video.path, frames=video.frames, fps=video.fps, height=video.size,
                             width=video.size, valid_fraction=valid_fraction, split_seed=split_seed,
                             max_malformed_fraction=video.max_malformed_fraction, video_key=video.video_key,
                             caption_key=video.caption_key)


def clip_spec(video: ClipSettings) -> dict:
    """What ``diffusion.json`` records of the clips: their frame count and rate (an exact fraction, as text)."""
    return {"frames": video.frames, "fps": str(frame_rate(video.fps))}


def open_clip_split(video: ClipSettings, valid_fraction: float, split_seed: int) -> tuple[VideoClips, VideoClips | None]:
    """(train, valid) clips; valid is None when ``valid_fraction`` is 0."""
    return open_video_split(source_config(video, valid_fraction, split_seed))


class ClipSamples(Dataset):
    """Clips with the ``noise_key`` of their position in the job's sample stream (as ``ImageSamples``)."""

    positioned = True  # the loader calls __getitem__((row, position))

    def __init__(self, clips: VideoClips, seed: int, keep_decoded: bool = True):
        self.clips, self.seed, self.keep = clips, seed, keep_decoded
        self._decoded: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.clips)

    def frames(self, row: int) -> np.ndarray:
        found = self._decoded.get(row)
        if found is None:
            found = self.clips.frames(row)
            if self.keep:
                self._decoded[row] = found
        return found

    def __getitem__(self, index: int | tuple[int, int]) -> dict:
        row, position = index if isinstance(index, tuple) else (index, index)
        return {"image": to_float(self.frames(row)),
                "noise_key": torch.tensor(noise_key(self.seed, position), dtype=torch.int64)}
