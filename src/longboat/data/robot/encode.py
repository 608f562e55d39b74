"""Video encoding with PyAV: one stream per camera file, episodes appended back to back at 1/fps per frame."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Literal

import av
import numpy as np
from pydantic import Field

from longboat.config.base import StrictModel

# LeRobot's encoder names; PyAV's "h264" encoder is libx264.
CODECS = {"libsvtav1": "libsvtav1", "h264": "libx264"}


class VideoOptions(StrictModel):
    """How camera frames are encoded (LeRobot's defaults: AV1, yuv420p, a keyframe every 2 frames, crf 30)."""

    codec: Literal["libsvtav1", "h264"] = "libsvtav1"
    pix_fmt: Literal["yuv420p", "yuv444p"] = "yuv420p"
    gop: int = Field(default=2, gt=0)
    crf: int = Field(default=30, ge=0, le=63)
    preset: int = Field(default=12, ge=0, le=13)  # libsvtav1 only: higher is faster

    def codec_options(self) -> dict[str, str]:
        opts = {"g": str(self.gop), "crf": str(self.crf)}
        if self.codec == "libsvtav1":
            opts["preset"] = str(self.preset)
        return opts


class VideoFileEncoder:
    """Appends uint8 RGB frames [H, W, 3] to one mp4; ``frames`` counts them; ``packets`` and ``bytes`` count what
    the encoder has put out so far (it holds some frames back for lookahead until it is closed)."""

    def __init__(self, path: Path, fps: int, width: int, height: int, options: VideoOptions):
        self.path, self.fps = path, fps
        path.parent.mkdir(parents=True, exist_ok=True)
        self._out = av.open(str(path), "w")
        self._stream = self._out.add_stream(CODECS[options.codec], rate=fps, options=options.codec_options())
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, options.pix_fmt
        self._time_base = Fraction(1, fps)
        self.frames = self.packets = self.bytes = 0

    def add(self, frames: np.ndarray) -> None:
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts, frame.time_base = self.frames, self._time_base
            self._mux(self._stream.encode(frame))
            self.frames += 1

    def _mux(self, packets) -> None:
        for p in packets:
            self.packets += 1
            self.bytes += p.size
            self._out.mux(p)

    def close(self) -> None:
        self._mux(self._stream.encode())
        self._out.close()

    def estimated_bytes(self, more_frames: int) -> float:
        """The file's size after ``more_frames`` more, at the bytes per frame put out so far; before the encoder
        has put anything out (its lookahead), a frame counts as 1/100 of its raw RGB size."""
        per_frame = self.bytes / self.packets if self.packets else self._stream.width * self._stream.height * 3 / 100
        return per_frame * (self.frames + more_frames)


def video_info(path: Path) -> dict:
    """The ``info`` LeRobot records for a video feature, read from its first file."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return {"video.height": s.height, "video.width": s.width, "video.codec": s.codec.canonical_name,
                "video.pix_fmt": s.pix_fmt, "video.is_depth_map": False, "video.fps": int(s.base_rate),
                "video.channels": 3, "has_audio": bool(c.streams.audio)}
