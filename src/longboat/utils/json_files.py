"""JSON from a user's files: one document or one JSONL line, with an error that names the file and line.

``json.loads`` fails in more ways than ``JSONDecodeError``: bytes that are not UTF-8, nesting deeper than Python's
recursion limit (``[[[[...]]]]`` raises RecursionError) and integers too long to convert. Every one of them is
reported here as one message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class JSONTextError(ValueError):
    """Text that is not one JSON value: ``reason`` in a few words, ``line`` (1-based) where known."""

    def __init__(self, reason: str, line: int | None = None):
        super().__init__(reason)
        self.reason, self.line = reason, line


def loads(data: str | bytes) -> Any:
    """The JSON value in ``data`` (bytes are decoded as UTF-8), or ``JSONTextError``."""
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise JSONTextError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})",
                                data.count(b"\n", 0, e.start) + 1) from None
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise JSONTextError(f"not valid JSON ({e.msg} at column {e.colno})", e.lineno) from None
    except RecursionError:
        raise JSONTextError("JSON nested too deeply to read") from None
    except ValueError as e:  # e.g. an integer longer than Python converts
        raise JSONTextError(f"not valid JSON ({e})") from None


def parse_json(data: str | bytes, where: str, error: type[Exception] = ValueError, line: int | None = None) -> Any:
    """The JSON value in ``data`` from ``where`` (a file, or an option); else ``error`` naming ``where`` and the
    line (``line``: the JSONL line ``data`` is)."""
    try:
        return loads(data)
    except JSONTextError as e:
        at = line if line is not None else e.line
        raise error(f"{where}{f':{at}' if at is not None else ''}: {e.reason}") from None


def read_json_file(path: str | Path, error: type[Exception] = ValueError) -> Any:
    """The JSON document in file ``path``; ``error`` naming the file (and line) when it cannot be read or parsed."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise error(f"{path}: unreadable ({e.strerror or e})") from None
    return parse_json(data, str(path), error)


def read_json_object(path: Path, error: type[Exception] = ValueError) -> dict:
    """The JSON object in ``path``; ``error`` naming the file when it is unreadable, not JSON or not an object."""
    data = read_json_file(path, error)
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
