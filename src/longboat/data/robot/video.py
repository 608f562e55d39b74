"""Frames of mp4 files at given timestamps, decoded with PyAV from open containers kept per process.

Each frame is decoded once while it is in use: converted frames stay in a cache bounded in bytes, so the frames
that neighbouring samples' windows share are not decoded again. The frames a request still lacks are decoded in
one pass: forward from where the decoder stopped when they lie just ahead of it (the next sample of a run of
neighbouring rows), otherwise from the keyframe at or before the first of them. Only frames that match a request
are converted to RGB. Containers are opened lazily in the process that reads (a DataLoader worker), kept in a
small LRU, and left alone after a fork.
"""

from __future__ import annotations

import bisect
import gc
import os
import weakref
from collections import OrderedDict
from pathlib import Path

import av
import numpy as np
from torch.utils.data import get_worker_info

from longboat.data.robot.errors import VideoDecodeError
from longboat.data.robot.fields import one_line

_READERS: weakref.WeakSet = weakref.WeakSet()
_INHERITED: list = []  # containers a forked process inherited: never used, never freed


# A PyAV codec context must not be freed in a forked child of the process that used it: freeing it waits on the
# decoder's thread state, copied mid-use from the parent, and hangs (seen with libdav1d). Containers end up in
# reference cycles, so a garbage collection in a loader worker would free the parent's. Hence: collect before
# forking, and let every reader start empty in the child while what it held stays referenced, untouched.
def _before_fork() -> None:
    gc.collect()


def _after_fork_in_child() -> None:
    for reader in list(_READERS):
        _INHERITED.extend(reader._open.values())
        reader._reset()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


# Continue decoding rather than seek when the next frame wanted is at most this many frames ahead: a seek costs
# about as much as decoding a few frames (more with longer keyframe intervals).
FORWARD_FRAMES = 4


class _OpenVideo:
    """A container and where its decoder stands: the live frame iterator and the time of its last frame."""

    def __init__(self, container: av.container.InputContainer):
        self.container = container
        self.stream = container.streams.video[0]
        self.frame_s = 1 / float(self.stream.average_rate or self.stream.guessed_rate or 30)
        self.frames = None  # the decode iterator since the last seek
        self.last: float | None = None  # time of the last frame it yielded

    def close(self) -> None:
        self.frames = None
        self.container.close()


class FrameCache:
    """Converted RGB frames keyed (file, time in seconds), least recently used dropped first beyond ``max_bytes``.
    Files are named by strings: hashing a ``Path`` costs more than the lookup."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._frames: OrderedDict[tuple[str, float], np.ndarray] = OrderedDict()
        self._times: dict[str, list[float]] = {}  # sorted times of the cached frames of each file

    def __len__(self) -> int:
        return len(self._frames)

    def get(self, path: str, t: float, tolerance_s: float) -> tuple[float, np.ndarray] | None:
        """(distance, frame) of the cached frame nearest ``t`` within the tolerance, if any."""
        times = self._times.get(path)
        if not times:
            return None
        i = bisect.bisect_left(times, t - tolerance_s)
        near = [ts for ts in times[i : i + 2] if abs(ts - t) < tolerance_s]
        if not near:
            return None
        ts = min(near, key=lambda ts: abs(ts - t))
        self._frames.move_to_end((path, ts))
        return abs(ts - t), self._frames[(path, ts)]

    def put(self, path: str, ts: float, frame: np.ndarray) -> None:
        if frame.nbytes > self.max_bytes or (path, ts) in self._frames:
            return
        self._frames[(path, ts)] = frame
        bisect.insort(self._times.setdefault(path, []), ts)
        self.bytes += frame.nbytes
        while self.bytes > self.max_bytes:
            (old_path, old_ts), old = self._frames.popitem(last=False)
            self.bytes -= old.nbytes
            times = self._times[old_path]
            del times[bisect.bisect_left(times, old_ts)]

    def forget(self, path: str) -> None:
        for ts in self._times.pop(path, []):
            self.bytes -= self._frames.pop((path, ts)).nbytes


class VideoFrameReader:
    """Decodes frames at timestamps (seconds) from video files; holds up to ``max_open`` containers open and up to
    ``cache_mb`` MiB of decoded frames (0: none kept)."""

    def __init__(self, tolerance_s: float = 1e-4, max_open: int = 16, cache_mb: float = 64):
        self.tolerance_s = tolerance_s
        self.max_open = max_open
        self.cache_mb = cache_mb
        self._reset()
        _READERS.add(self)

    def _reset(self) -> None:
        self._open: OrderedDict[Path, _OpenVideo] = OrderedDict()
        self.cache = FrameCache(int(self.cache_mb * 2**20))

    def __getstate__(self) -> dict:
        # Open containers and decoded frames stay in the process that made them; a worker starts with none.
        return {k: v for k, v in self.__dict__.items() if k not in ("_open", "cache")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()
        _READERS.add(self)

    def _video(self, path: Path) -> _OpenVideo:
        video = self._open.get(path)
        if video is not None:
            self._open.move_to_end(path)
            return video
        if not path.is_file():
            raise VideoDecodeError(f"{path}: video file not found")
        try:
            container = av.open(str(path))
            if not container.streams.video:
                raise VideoDecodeError(f"{path}: cannot open video: it has no video stream (truncated or damaged?)")
        except av.error.FFmpegError as e:
            raise VideoDecodeError(f"{path}: cannot open video ({one_line(e)})") from None
        if get_worker_info() is None:  # loader workers are the parallelism; threads in each would oversubscribe
            container.streams.video[0].thread_type = "AUTO"
        video = self._open[path] = _OpenVideo(container)
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)[1].close()
        return video

    def close(self) -> None:
        for video in self._open.values():
            video.close()
        self._open.clear()

    def decode(self, path: Path, timestamps: list[float]) -> np.ndarray:
        """uint8 RGB frames [T, H, W, 3], the frame nearest each timestamp (within the tolerance)."""
        try:
            return self._decode(path, timestamps)
        except av.error.FFmpegError as e:
            self._forget(path)
            raise VideoDecodeError(f"{path}: decoding failed near {min(timestamps):.4f}s ({one_line(e)})") from None

    def _forget(self, path: Path) -> None:
        video = self._open.pop(path, None)
        if video is not None:
            video.close()
        self.cache.forget(str(path))

    def _decode(self, path: Path, timestamps: list[float]) -> np.ndarray:
        video = self._video(path)
        stream, tol, name = video.stream, self.tolerance_s, str(path)
        query = np.asarray(timestamps, dtype=np.float64)
        best_dist = np.full(len(query), np.inf)
        best: list[np.ndarray | None] = [None] * len(query)
        for i, t in enumerate(query):
            hit = self.cache.get(name, float(t), tol)
            if hit is not None:
                best_dist[i], best[i] = hit
        missing = query[best_dist >= tol]
        if not len(missing):
            return np.stack(best)
        first, last = float(missing.min()), float(missing.max())
        ahead = None if video.last is None or video.frames is None else first - video.last
        if ahead is None or not 0 < ahead <= FORWARD_FRAMES * video.frame_s + tol:
            # backward=True lands on the keyframe at or before the target; the codec is flushed by the seek.
            video.container.seek(max(int((first - tol) / stream.time_base), 0), stream=stream, backward=True,
                                 any_frame=False)
            video.frames, video.last = video.container.decode(stream), None
        decoded: list[float] = []
        for frame in video.frames:
            if frame.pts is None:
                continue
            ts = float(frame.pts * stream.time_base)
            video.last = ts
            decoded.append(ts)
            dist = np.abs(query - ts)
            closer = (dist < best_dist) & (dist < tol)
            if closer.any():
                rgb = frame.to_ndarray(format="rgb24")
                self.cache.put(name, ts, rgb)
                for i in np.flatnonzero(closer):
                    best_dist[i], best[i] = dist[i], rgb
            if ts >= last - tol:
                break
        else:  # the end of the file: a later request must seek
            video.frames = None
        bad = best_dist >= tol
        if bad.any():
            near = ", ".join(f"{t:.4f}" for t in decoded[-3:]) or "none"
            raise VideoDecodeError(
                f"{path}: no frame within {tol}s of timestamp(s) {', '.join(f'{t:.4f}' for t in query[bad])} "
                f"(decoded {len(decoded)} frame(s) up to {last:.4f}s; last at {near})")
        return np.stack(best)
