"""Short clips to mp4 with PyAV: H.264 (libx264) in yuv420p where the frame's sides are even (what players take),
yuv444p otherwise; every frame a keyframe-led group of ``gop``, so a reader may start at frame 0 without seeking."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from longboat.errors import LongboatError


def write_mp4(path: str | Path, frames: np.ndarray, fps: Fraction | float | str, crf: int = 12, gop: int = 8) -> None:
    """Write uint8 RGB ``frames`` [T, H, W, 3] to ``path`` at ``fps`` frames per second."""
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
        raise LongboatError(f"{path}: expected uint8 RGB frames [T, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    rate = Fraction(str(fps)).limit_denominator(1001)
    _, height, width, _ = frames.shape
    even = height % 2 == 0 and width % 2 == 0
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=rate, options={"crf": str(crf), "g": str(gop)})
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p" if even else "yuv444p"
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts, frame.time_base = i, 1 / rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
