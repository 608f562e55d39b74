"""Copies of the LeRobot fixtures with one thing changed: a metadata value, a column, a line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
INFO = "meta/info.json"
V3_EPISODES = "meta/episodes/chunk-000/file-000.parquet"
V3_DATA = "data/chunk-000/file-000.parquet"
V3_VIDEO = "videos/observation.images.cam/chunk-000/file-000.mp4"
V21_EPISODES = "meta/episodes.jsonl"
V21_TASKS = "meta/tasks.jsonl"
V21_EPISODES_STATS = "meta/episodes_stats.jsonl"


def copy_fixture(version: str, dest: Path) -> Path:
    """``version``: "v30" or "v21"."""
    return Path(shutil.copytree(FIXTURES / f"lerobot_{version}" / "dataset", dest))


def read_info(root: Path) -> dict:
    return json.loads((root / INFO).read_text())


def edit_info(root: Path, **changes) -> dict:
    info = {**read_info(root), **changes}
    (root / INFO).write_text(json.dumps(info))
    return info


def set_column(path: Path, name: str, values: list | pa.Array) -> None:
    """Replace (or add) a parquet column, keeping the others and the schema metadata."""
    table = pq.read_table(path)
    array = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    if name in table.column_names:
        table = table.set_column(table.column_names.index(name), name, array)
    else:
        table = table.append_column(name, array)
    pq.write_table(table, path)


def column(path: Path, name: str) -> list:
    return pq.read_table(path, columns=[name]).column(name).to_pylist()


def jsonl_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
