"""One run per directory: an exclusive POSIX lock on ``run_dir/.lock`` for as long as the run lives.

The kernel drops the lock when its process dies, however it dies, so a lock left by a dead run is taken over
without any clean-up; the file only records who holds it, for the error message. A POSIX (``lockf``) lock, not
``flock``: it belongs to the process, so forked data-loader workers that outlive a killed run for a moment do
not keep holding it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from longboat.errors import LongboatError

LOCK_FILE = ".lock"


class RunDirLockedError(LongboatError):
    """Another live process is running in this run directory."""


class RunDirLock:
    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _describe(os.read(fd, 4096))
            os.close(fd)
            raise RunDirLockedError(f"{self.path.parent} is in use by {holder}; wait for that run to end or choose "
                                    "another run_dir") from None
        os.ftruncate(fd, 0)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    def __enter__(self) -> "RunDirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _describe(raw: bytes) -> str:
    try:
        r = json.loads(raw)
        return f"pid {r['pid']} on host {r['host']} (since {r['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"
