"""The progress bar of ``data record`` and ``eval``: a resumed evaluation's bar starts at the episodes already done."""

import io
import sys
from dataclasses import dataclass

from longboat.utils.progress import RecordProgress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@dataclass
class _Tally:
    name: str = "reach-v3"
    episodes: int = 5
    successes: int = 2


def test_a_resumed_bar_starts_at_the_episodes_already_done(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with RecordProgress(True, total=10, completed=4) as bar:
        bar.advance(_Tally())
    shown = terminal.getvalue()
    assert "5/10" in shown and "reach-v3 2/5 successful" in shown
    assert "1/10" not in shown


def test_no_bar_off_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with RecordProgress(True, total=10, completed=4) as bar:
        bar.advance(_Tally())
    assert sys.stderr.getvalue() == ""
