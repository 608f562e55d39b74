"""Frames of mp4 files at given timestamps, decoded with PyAV from open containers kept per process.

A window's frames are decoded in one pass: seek to the keyframe at or before the first requested time, decode
forward until the last one, and convert to RGB only the frames that match a request. Containers are opened
lazily in the process that reads (a DataLoader worker), kept in a small LRU, and left alone after a fork.
"""

from __future__ import annotations

import gc
import os
import weakref
from collections import OrderedDict
from pathlib import Path

import av
import numpy as np
from torch.utils.data import get_worker_info

from longboat.data.robot.errors import VideoDecodeError

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
        reader._open, reader._pid = OrderedDict(), os.getpid()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


class VideoFrameReader:
    """Decodes frames at timestamps (seconds) from video files; holds up to ``max_open`` containers open."""

    def __init__(self, tolerance_s: float = 1e-4, max_open: int = 16):
        self.tolerance_s = tolerance_s
        self.max_open = max_open
        self._open: OrderedDict[Path, av.container.InputContainer] = OrderedDict()
        self._pid = os.getpid()
        _READERS.add(self)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        _READERS.add(self)

    def __getstate__(self) -> dict:
        # Open containers stay in the process that opened them; a worker starts with none.
        return {**self.__dict__, "_open": OrderedDict(), "_pid": None}

    def _container(self, path: Path):
        if self._pid != os.getpid():  # unpickled in a spawned worker
            self._open, self._pid = OrderedDict(), os.getpid()
        container = self._open.get(path)
        if container is not None:
            self._open.move_to_end(path)
            return container
        if not path.is_file():
            raise VideoDecodeError(f"{path}: video file not found")
        try:
            container = av.open(str(path))
            if not container.streams.video:
                raise VideoDecodeError(f"{path}: cannot open video: it has no video stream (truncated or damaged?)")
        except av.error.FFmpegError as e:
            raise VideoDecodeError(f"{path}: cannot open video ({e})") from None
        if get_worker_info() is None:  # loader workers are the parallelism; threads in each would oversubscribe
            container.streams.video[0].thread_type = "AUTO"
        self._open[path] = container
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)[1].close()
        return container

    def close(self) -> None:
        for c in self._open.values():
            c.close()
        self._open.clear()

    def decode(self, path: Path, timestamps: list[float]) -> np.ndarray:
        """uint8 RGB frames [T, H, W, 3], the frame nearest each timestamp (within the tolerance)."""
        try:
            return self._decode(path, timestamps)
        except av.error.FFmpegError as e:
            self._forget(path)
            raise VideoDecodeError(f"{path}: decoding failed near {min(timestamps):.4f}s ({e})") from None

    def _forget(self, path: Path) -> None:
        c = self._open.pop(path, None)
        if c is not None:
            c.close()

    def _decode(self, path: Path, timestamps: list[float]) -> np.ndarray:
        container = self._container(path)
        stream = container.streams.video[0]
        query = np.asarray(timestamps, dtype=np.float64)
        tol = self.tolerance_s
        first, last = float(query.min()), float(query.max())
        # backward=True lands on the keyframe at or before the target; the codec is flushed by the seek.
        container.seek(max(int((first - tol) / stream.time_base), 0), stream=stream, backward=True, any_frame=False)
        best_dist = np.full(len(query), np.inf)
        best: list[np.ndarray | None] = [None] * len(query)
        decoded: list[float] = []
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            ts = float(frame.pts * stream.time_base)
            decoded.append(ts)
            dist = np.abs(query - ts)
            closer = dist < best_dist
            if closer.any():
                rgb = frame.to_ndarray(format="rgb24")
                for i in np.flatnonzero(closer):
                    best_dist[i], best[i] = dist[i], rgb
            if ts >= last - tol:
                break
        bad = best_dist >= tol
        if bad.any():
            near = ", ".join(f"{t:.4f}" for t in decoded[-3:]) or "none"
            raise VideoDecodeError(
                f"{path}: no frame within {tol}s of timestamp(s) {', '.join(f'{t:.4f}' for t in query[bad])} "
                f"(decoded {len(decoded)} frame(s) from the keyframe before {first:.4f}s; last at {near})")
        return np.stack(best)
