"""The identity and content of a data source's files, as a JSON-able description: what a latent cache's name hashes
so that a changed, added or removed file makes a new cache and an unchanged source finds the old one.

A folder: every file under it (relative name, size, SHA-256 of its bytes). A rows file (.jsonl, .parquet, .csv):
the file's own hash, plus each file its rows name in the image or video column (relative to the rows file), hashed
the same way. ``digits``: scikit-learn's version, which ships them.
"""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

from longboat.config.base import ConfigError
from longboat.data.source_files import read_rows


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, read a megabyte at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digest(path: Path) -> dict:
    """Size and SHA-256 of a file's bytes; a missing file is recorded as such (its row is unreadable anyway)."""
    if not path.is_file():
        return {"missing": True}
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _rows(path: Path) -> list[dict]:
    if path.name.endswith(".csv"):
        with path.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    return read_rows(path)


def source_fingerprint(source: str, video: bool, keys: dict) -> dict:
    """What identifies ``source``'s content; ``keys`` names the columns that hold file paths."""
    if source == "digits" and not video:
        import sklearn

        return {"digits": sklearn.__version__}
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not any(
            part.startswith(".") for part in p.relative_to(path).parts))
        return {"folder": str(path.resolve()), "files": {str(p.relative_to(path)): file_digest(p) for p in files}}
    if not path.is_file():
        raise ConfigError(f"--source {source}: no such folder or file (expected 'digits', a folder of class "
                          "subfolders, a .jsonl / .parquet file, or with --frames a metadata.csv)")
    if not path.name.endswith((".jsonl", ".parquet", ".csv")):
        raise ConfigError(f"--source {source}: expected 'digits', a folder of class subfolders, a .jsonl / .parquet "
                          "file, or with --frames a metadata.csv")
    column = keys.get("video_key") or keys.get("image_key")
    try:
        rows = _rows(path)
    except (UnicodeDecodeError, csv.Error) as err:
        raise ConfigError(f"--source {source}: not readable rows ({err})") from None
    named = sorted({row[column] for row in rows if isinstance(row, dict) and isinstance(row.get(column), str)
                    and row[column]})
    return {"file": str(path.resolve()), **file_digest(path),
            "files": {name: file_digest(path.parent / name) for name in named}}
