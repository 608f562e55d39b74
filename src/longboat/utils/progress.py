"""A live progress bar of the episodes recorded or evaluated, with each environment's success rate so far (terminals
only)."""

from __future__ import annotations

import sys


class RecordProgress:
    def __init__(self, enabled: bool, total: int, completed: int = 0):
        """``completed``: episodes already done before this run (a resumed evaluation), where the bar starts."""
        self._progress = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._task = self._progress.add_task("recording", total=total, completed=completed)

    def __enter__(self) -> "RecordProgress":
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def advance(self, env) -> None:
        """One more episode of ``env`` (an ``EnvResult``) is done."""
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=f"{env.name} "
                                  f"{env.successes}/{env.episodes} successful")

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
