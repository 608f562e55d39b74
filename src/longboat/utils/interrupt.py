"""Stop signals (Ctrl-C, SIGTERM) turned into what the code around them can handle safely.

A KeyboardInterrupt raised wherever the signal happens to land can surface as another error (inside a ctypes call,
such as MuJoCo's EGL rendering, it becomes ``ctypes.ArgumentError``) or cut a write in half. Loops that step a
simulator instead check a flag between steps and stop cleanly. A SIGTERM, which would otherwise end the process
on the spot, is raised like Ctrl-C where a command has half-written files to remove; a few renames that must
all happen hold both signals until they are done.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stop signal as an exception; the command exits with 128 + ``signum``, as a shell reports a signal."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


@contextmanager
def ctrl_c_sets(flag: threading.Event) -> Iterator[threading.Event]:
    """While the block runs, Ctrl-C sets ``flag`` instead of raising KeyboardInterrupt. Off the main thread, or
    where SIGINT is ignored (a job started in the background), nothing changes."""
    with signals_set(flag, (signal.SIGINT,)):
        yield flag


@contextmanager
def signals_set(flag: threading.Event, signums: Iterable[int] = STOP_SIGNALS) -> Iterator[threading.Event]:
    """While the block runs, each of ``signums`` sets ``flag`` and is kept in ``flag.signum`` (the last one)
    instead of acting. Off the main thread, and for a signal that is ignored, nothing changes."""
    def note(signum, _frame):
        flag.signum = signum
        flag.set()

    with _handlers(note, signums):
        yield flag


def stop_signal(flag: threading.Event) -> int:
    """The signal that set ``flag`` through :func:`signals_set` (SIGINT when it was set otherwise)."""
    return getattr(flag, "signum", signal.SIGINT)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Interrupted` in this process, so ``finally`` and ``except``
    blocks remove what was half-written; where SIGTERM already has a handler (a trainer's, a server's) or is
    ignored, nothing changes. A process forked inside the block dies of SIGTERM as usual."""
    global _sigterm_raises
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def raise_here(signum, _frame):
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, raise_here)
    _sigterm_raises = True
    try:
        yield
    finally:
        _sigterm_raises = False
        signal.signal(signal.SIGTERM, previous)


_sigterm_raises = False  # sigterm_raises is in effect in this process


def _default_sigterm_in_child() -> None:
    """A process forked inside :func:`sigterm_raises` (a process pool's worker) dies of SIGTERM as usual: its
    parent's cleanup is not its own, and a pool ends its workers with SIGTERM."""
    global _sigterm_raises
    if _sigterm_raises:
        _sigterm_raises = False
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # forked from a thread Python does not count as the main one
            pass


os.register_at_fork(after_in_child=_default_sigterm_in_child)


@contextmanager
def signals_held(signums: Iterable[int] = STOP_SIGNALS) -> Iterator[None]:
    """Hold ``signums`` while the block runs and act on them, as they would have been acted on, once it ends."""
    held: list[int] = []
    try:
        with _handlers(lambda signum, _frame: held.append(signum), signums):
            yield
    finally:
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)  # to the handler now back in place


@contextmanager
def _handlers(handler, signums: Iterable[int]) -> Iterator[None]:
    """Install ``handler`` for those of ``signums`` that are not ignored and were set from Python (main thread
    only); put the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in signums:
        current = signal.getsignal(signum)
        if current is signal.SIG_IGN or current is None:  # None: installed outside Python, cannot be put back
            continue
        previous[signum] = current
    try:
        for signum in previous:
            signal.signal(signum, handler)
        yield
    finally:
        for signum, current in previous.items():
            signal.signal(signum, current)
