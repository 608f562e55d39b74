"""``time_limit``: stop a block of Python code that runs past its time, in any thread, at almost no cost.

A watchdog thread raises an exception into a thread whose block passed its deadline (CPython's
``PyThreadState_SetAsyncExc``), which the thread sees at its next bytecode: loops and recursion stop wherever
they are, while a single call into C finishes first. Entering and leaving a block costs a dict entry under a lock,
not a trace of every line, so it can wrap work done per row of a dataset (a chat template's render).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator


class _PastDeadline(BaseException):
    """Raised into a thread by the watchdog; a BaseException, so no ``except Exception`` on the way swallows it."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Have ``thread_id`` raise ``exc`` at its next bytecode (None: cancel one still pending)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class _Watchdog:
    """One daemon thread that raises ``_PastDeadline`` in each thread whose block runs past its deadline; it is
    woken only by a deadline sooner than the one it sleeps until (blocks of one length in a row wake it once)."""

    def __init__(self):
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked loader worker starts a watchdog of its own

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._deadlines: dict[int, float] = {}  # thread id -> when its block must have ended
        self._fired: set[int] = set()
        self._wake_at: float | None = None  # when the watchdog wakes next; None: it sleeps until notified
        self._thread: threading.Thread | None = None

    def watch(self, thread_id: int, end: float) -> None:
        with self._cond:
            self._deadlines[thread_id] = end
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="longboat-deadline", daemon=True)
                self._thread.start()
            if self._wake_at is None or end < self._wake_at:
                self._cond.notify()

    def release(self, thread_id: int) -> bool:
        """Stop watching; whether the deadline had passed (an exception raised for it and still pending is
        cancelled)."""
        with self._cond:
            self._deadlines.pop(thread_id, None)
            if thread_id not in self._fired:
                return False
            self._fired.discard(thread_id)
            _raise_in(thread_id, None)
            return True

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for thread_id in [t for t, end in self._deadlines.items() if end <= now]:
                    del self._deadlines[thread_id]
                    self._fired.add(thread_id)
                    _raise_in(thread_id, _PastDeadline)
                self._wake_at = min(self._deadlines.values(), default=None)
                self._cond.wait(None if self._wake_at is None else self._wake_at - now)


_WATCHDOG = _Watchdog()


@contextmanager
def time_limit(seconds: float, error: Callable[[], Exception]) -> Iterator[None]:
    """Raise ``error()`` when the block runs past ``seconds``. Blocks in one thread do not nest."""
    thread_id = threading.get_ident()
    _WATCHDOG.watch(thread_id, time.monotonic() + seconds)
    try:
        yield
    except _PastDeadline:
        _WATCHDOG.release(thread_id)
        raise error() from None
    finally:
        try:
            passed = _WATCHDOG.release(thread_id)
        except _PastDeadline:  # raised as the block ended, before it could be cancelled
            passed = _WATCHDOG.release(thread_id) or True
        if passed:
            raise error()
