"""DCP's file-system writer, computing each file's checksum from the bytes as they are written.

Each rank knows the checksums of the files it wrote (its ``.distcp`` files; the coordinator also ``.metadata``);
``CheckpointManager.save`` gathers them into the manifest. Computing them while writing costs no second read of
the checkpoint.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter

from longboat.checkpoint.integrity import ChecksumStream


class _ChecksummingFileSystem(FileSystem):
    """DCP's local file system, whose write streams keep a CRC-32 of what passes through them."""

    def __init__(self):
        super().__init__()
        self.checksums: dict[str, str] = {}  # file name → checksum, after the stream is closed
        self._lock = threading.Lock()  # DCP may write files from several threads

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator:
        if "w" not in mode and "a" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            stream = ChecksumStream(raw)
            yield stream
        with self._lock:
            self.checksums[Path(path).name] = stream.checksum

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)  # DCP writes ``.metadata`` under a temporary name, then renames it
        with self._lock:
            if Path(path).name in self.checksums:
                self.checksums[Path(new_path).name] = self.checksums.pop(Path(path).name)


class ChecksummingWriter(FileSystemWriter):
    """``FileSystemWriter`` with DCP's defaults; ``checksums`` maps each file this rank wrote to its CRC-32."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self.fs = _ChecksummingFileSystem()
        self.path = self.fs.init_path(path)

    @property
    def checksums(self) -> dict[str, str]:
        return dict(self.fs.checksums)


__all__ = ["ChecksummingWriter"]
