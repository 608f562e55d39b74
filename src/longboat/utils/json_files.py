"""Reading a JSON object from a file, with an error that names the file."""

from __future__ import annotations

import json
from pathlib import Path


def read_json_object(path: Path, error: type[Exception] = ValueError) -> dict:
    """The JSON object in ``path``; ``error`` naming the file when it is unreadable, not JSON or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
