"""Console output: one rich console, quiet on every rank but 0."""

from __future__ import annotations

import os

from rich.console import Console
from rich.markup import escape


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


console = Console(stderr=False, highlight=False, soft_wrap=True, quiet=rank() != 0)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def printable(text: str) -> str:
    """``text`` on one line: control characters (a newline in a quoted path, say) written as escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def error(msg: str) -> None:
    prefix = f"[rank {rank()}] " if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1 else ""
    # One line whatever the message quotes; escaped for rich: "[rank 1]" and values such as "data.paths=[a]"
    # would otherwise be read as markup and vanish.
    err_console.print(f"[bold red]error:[/] {escape(printable(prefix + msg))}", markup=True)
