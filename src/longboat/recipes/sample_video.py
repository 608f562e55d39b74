"""What ``longboat sample`` writes for a video generator: an mp4 per sampled clip (H.264 at the frame rate the model
was trained at) and ``grid.png``, each clip's first, middle and last frames side by side, a row per prompt."""

from __future__ import annotations

from pathlib import Path

import torch

from longboat.config.base import ConfigError
from longboat.data.clip_writer import write_mp4
from longboat.data.video_sources import TIME_COMPRESSION


def check_frames(frames: int | None, trained: int | None, source: str) -> int | None:
    """The frame count to sample: ``frames`` (1 + 4k) for a video model, its trained count when None; an image
    model refuses ``--frames``."""
    if trained is None:
        if frames is not None:
            raise ConfigError(f"--frames: {source} generates images, not clips; drop --frames")
        return None
    if frames is None:
        return trained
    if frames < 1 or frames % TIME_COMPRESSION != 1:
        raise ConfigError(f"--frames {frames}: a clip has 1 + 4k frames (the model was trained on {trained})")
    return frames


def key_frames(clips: torch.Tensor) -> torch.Tensor:
    """[N, C, T, H, W] -> [N·3, C, H, W]: each clip's first, middle and last frames."""
    t = clips.shape[2]
    return clips[:, :, [0, t // 2, t - 1]].transpose(1, 2).flatten(0, 1)


def to_uint8(clip: torch.Tensor) -> "torch.Tensor":
    """[C, T, H, W] in [-1, 1] -> uint8 RGB [T, H, W, 3] (grey repeated to three channels)."""
    frames = ((clip.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0)
    return frames.expand(-1, -1, -1, 3).contiguous() if frames.shape[-1] == 1 else frames


def write_clips(stage: Path, clips: torch.Tensor, names: list[str], fps: str) -> None:
    """One mp4 per clip [N, C, T, H, W] in [-1, 1], named ``names[i]``.mp4, at ``fps``."""
    for clip, name in zip(clips, names):
        write_mp4(stage / f"{name}.mp4", to_uint8(clip).numpy(), fps)
