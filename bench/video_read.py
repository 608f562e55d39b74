"""Reading one clip through ``data/video_sources.py`` (the path a video training run reads): an 81-frame clip at
16 fps read at 480 × 832 as float32 [3, T, H, W], from a clip of the same size and from a 720p clip (scaled and
cropped). Clips are H.264 written here; the median of the timed reads is reported with the decode and the float
conversion apart.

    python -P bench/video_read.py [--frames 81 --fps 16 --reads 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import av
import numpy as np

from longboat.data.video_sources import VideoSourceConfig, open_clips, to_float


def write_clip(path: Path, frames: int, fps: int, height: int, width: int) -> None:
    """A moving gradient, so the encoder has motion to code, as in real footage."""
    y, x = np.mgrid[0:height, 0:width]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps, options={"crf": "23", "preset": "veryfast"})
        stream.height, stream.width, stream.pix_fmt = height, width, "yuv420p"
        for k in range(frames):
            array = np.stack([(x + 4 * k) % 256, (y + 2 * k) % 256, (x + y + k) % 256], -1).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


def median_s(fn, reads: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--reads", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, (h, w) in {"480x832": (480, 832), "720x1280": (720, 1280)}.items():
            write_clip(root / f"{name}.mp4", args.frames, args.fps, h, w)
            (root / f"{name}.jsonl").write_text(f'{{"video": "{name}.mp4", "caption": ""}}\n')
            clips = open_clips(VideoSourceConfig(source=str(root / f"{name}.jsonl"), frames=args.frames, fps=args.fps,
                                                 height=480, width=832))
            frames = clips.frames(0)
            total = median_s(lambda: clips[0], args.reads)
            decode = median_s(lambda: clips.frames(0), args.reads)
            convert = median_s(lambda: to_float(frames), args.reads)
            print(f"{name} -> 480x832, {args.frames} frames: read {total:.3f} s (decode + RGB + resize {decode:.3f} s, "
                  f"to float {convert:.3f} s)")


if __name__ == "__main__":
    main()
