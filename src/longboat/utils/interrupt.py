"""Ctrl-C as a flag that long loops check at safe points.

A KeyboardInterrupt raised wherever the signal happens to land can surface as another error (inside a ctypes call,
such as MuJoCo's EGL rendering, it becomes ``ctypes.ArgumentError``) or cut a write in half. Loops that step a
simulator instead check the flag between steps and stop cleanly.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def ctrl_c_sets(flag: threading.Event) -> Iterator[threading.Event]:
    """While the block runs, Ctrl-C sets ``flag`` instead of raising KeyboardInterrupt. Off the main thread, or
    where SIGINT is ignored (a job started in the background), nothing changes."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda *_: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
