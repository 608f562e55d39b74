"""What a checkpoint directory holds, recorded before it is marked complete, and checked before it is read.

The manifest lists every file with its size and its CRC-32 (computed from the bytes as they are written). A file
lost, cut short or changed afterwards (a full disk, a copy interrupted, a bit flipped on disk or in transfer) is
found by comparing the directory with that list, before DCP is asked to read it. Manifests written before
checksums were recorded are checked for sizes only; checkpoints without a list (format 1, and format 2 before it)
only for DCP's ``.metadata`` and at least one ``.distcp`` data file.
"""

from __future__ import annotations

import io
import json
import os
import threading
import zlib
from pathlib import Path

from longboat.checkpoint.errors import CheckpointError
from longboat.utils.json_files import read_json_object

MANIFEST = "checkpoint.json"
COMPLETE_MARKER = "COMPLETE"
# Written after the list is taken, so not in it.
_UNLISTED = frozenset({MANIFEST, COMPLETE_MARKER})
CHECKSUM = "crc32"  # a checksum against damage, not tampering: fast enough to compute on every save and resume
_CHUNK = 8 << 20


def format_checksum(crc: int) -> str:
    return f"{CHECKSUM}:{crc & 0xFFFFFFFF:08x}"


class ChecksumStream(io.RawIOBase):
    """A binary stream that passes every write on to ``raw`` and keeps the running CRC-32 of the bytes written."""

    def __init__(self, raw):
        super().__init__()
        self.raw, self.crc = raw, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        n = self.raw.write(data)
        self.crc = zlib.crc32(memoryview(data).cast("B")[:n], self.crc)
        return n

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        if not self.raw.closed:
            self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        super().close()  # flushes
        self.raw.close()

    @property
    def checksum(self) -> str:
        return format_checksum(self.crc)


# Checksums known to this process, by file identity and state: a checkpoint saved or verified here is not read
# again to be verified (every call of ``latest()``), while a file changed since has another size or mtime.
_known: dict[tuple[int, int, int, int], str] = {}
_known_lock = threading.Lock()


def _identity(file: Path) -> tuple[int, int, int, int]:
    st = file.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def remember_checksum(file: str | os.PathLike, checksum: str) -> None:
    """Record the checksum of ``file``, computed while it was written."""
    with _known_lock:
        _known[_identity(Path(file))] = checksum


def file_checksum(file: str | os.PathLike) -> str:
    """The CRC-32 of ``file``'s bytes, as the manifest records it."""
    file = Path(file)
    key = _identity(file)
    with _known_lock:
        if key in _known:
            return _known[key]
    crc = 0
    with open(file, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    with _known_lock:
        _known[key] = format_checksum(crc)
    return _known[key]


def file_sizes(directory: str | os.PathLike) -> dict[str, int]:
    """Every file under ``directory`` (relative POSIX path) and its size in bytes, except the manifest and marker."""
    root = Path(directory)
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).as_posix() not in _UNLISTED}


def read_manifest(path: str | os.PathLike) -> dict | None:
    """The manifest of checkpoint ``path``, or None when it has none (format 1)."""
    file = Path(path) / MANIFEST
    if not file.is_file():
        return None
    return read_json_object(file, CheckpointError)


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """The first thing wrong with the files of checkpoint ``path``, or None when they are as recorded."""
    path = Path(path)
    try:
        manifest = read_manifest(path)
    except CheckpointError as e:
        return str(e)
    files = manifest.get("files") if manifest else None
    if not isinstance(files, dict):
        if not (path / ".metadata").is_file():
            return "missing file .metadata"
        if not any(path.glob("*.distcp")):
            return "no .distcp data file"
        return None
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            return f"missing file {name}"
        actual = file.stat().st_size
        if actual != size:
            return f"{name} is {actual} bytes, the manifest records {size}"
    checksums = manifest.get("checksums")
    if checksums is None:
        return None  # written before checksums were recorded: sizes only
    if not isinstance(checksums, dict):
        return f"{MANIFEST}: checksums is not an object"
    for name, expected in checksums.items():
        if name not in files:
            return f"{MANIFEST}: checksum for unlisted file {name}"
        actual = file_checksum(path / name)
        if actual != expected:
            return f"{name} fails its checksum ({actual}, the manifest records {expected})"
    return None


def has_checksums(path: str | os.PathLike) -> bool:
    """Whether the manifest of checkpoint ``path`` records checksums (else its files are checked by size only)."""
    try:
        manifest = read_manifest(path)
    except CheckpointError:
        return False
    return bool(manifest) and isinstance(manifest.get("checksums"), dict)


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Raise ``CheckpointError`` naming checkpoint ``path`` and its first problem, if it has one."""
    problem = checkpoint_problem(path)
    if problem is not None:
        raise CheckpointError(f"{path}: damaged checkpoint: {problem}")


__all__ = ["CHECKSUM", "COMPLETE_MARKER", "MANIFEST", "ChecksumStream", "checkpoint_problem", "file_checksum",
           "file_sizes", "has_checksums", "read_manifest", "remember_checksum", "verify_checkpoint"]
