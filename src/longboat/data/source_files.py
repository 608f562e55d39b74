"""What the image and video sources share: rows of ``.jsonl`` / ``.parquet`` files, unreadable files counted
against ``max_malformed_fraction``, and the held-out split drawn from its own seed."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from longboat.config.base import ConfigError

NAMED = 5  # bad files a failure names


def split_indices(n: int, valid_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, valid) indices of ``n`` items: a permutation drawn from ``seed``, ``valid_fraction`` held out."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_valid = int(round(n * valid_fraction))
    return order[n_valid:].sort().values, order[:n_valid].sort().values


def held_out(n: int, valid_fraction: float, seed: int, source: str,
             what: str = "images") -> tuple[torch.Tensor, torch.Tensor]:
    """``split_indices``, refusing a split that leaves either side empty."""
    train, valid = split_indices(n, valid_fraction, seed)
    if len(valid) == 0 or len(train) == 0:
        raise ConfigError(f"data.valid_fraction={valid_fraction}: {source} holds {n} {what}, too few to split")
    return train, valid


def check_malformed(bad: list[str], total: int, limit: float, where: str, what: str = "images",
                    why: str = "cannot be read") -> None:
    """Refuse a source with nothing in it, or whose unreadable share ``len(bad) / total`` exceeds ``limit``; the
    message names the first bad files."""
    if total == 0:
        raise ConfigError(f"data.source: {where} holds no {what}")
    if bad and len(bad) / total > limit:
        named = ", ".join(bad[:NAMED]) + (f" and {len(bad) - NAMED} more" if len(bad) > NAMED else "")
        raise ConfigError(f"data.source: {len(bad)} of {total} {what} in {where} {why} ({named}); "
                          f"data.max_malformed_fraction={limit} allows {int(limit * total)}")


def read_rows(path: Path) -> list[dict]:
    """The rows of a ``.parquet`` file or the objects of a ``.jsonl`` file (blank lines skipped)."""
    if path.name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several types for a file that is not parquet
            raise ConfigError(f"data.source: {path}: cannot read as parquet: {e}") from None
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"data.source: {path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"data.source: {path}:{number}: expected an object per line")
            rows.append(row)
    return rows


def row_unit(path: Path) -> str:
    """What a row of ``path`` is called in messages: a parquet 'row' or a jsonl 'line'."""
    return "row" if path.name.endswith(".parquet") else "line"
