"""The episode metadata of a LeRobot dataset (v3.0 ``meta/episodes/*.parquet``, v2.1 ``meta/episodes.jsonl``), read
into one table and checked: types, one row per episode, lengths that agree with the global frame ranges, chunks.

Both layouts are read into one in-memory form: per-episode arrays (index, length, global frame range, data file,
and per camera the video file and the episode's start time in it) so the reader never asks which version it has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from longboat.data.robot.errors import RobotDataError
from longboat.data.robot.fields import (expect_column, integer, parse_json, read_text, show, string_list,
                                        unreadable_parquet)

V3_EPISODES_DIR = "meta/episodes"
V21_EPISODES_PATH = "meta/episodes.jsonl"


@dataclass
class EpisodeTable:
    """One entry per episode, in the dataset's order (by ``episode_index``)."""

    index: np.ndarray  # episode_index
    length: np.ndarray
    start: np.ndarray  # dataset_from_index: global row index of the first frame
    data_file: list[str]  # relative path of the parquet file that holds the episode's rows
    video_file: dict[str, list[str]]  # camera -> relative mp4 path per episode
    video_start: dict[str, np.ndarray]  # camera -> from_timestamp (0 for v2.1's one file per episode)
    tasks: list[list[str]]

    def position(self, episode_index: int) -> int:
        pos = int(np.searchsorted(self.index, episode_index))
        if pos >= len(self.index) or self.index[pos] != episode_index:
            raise KeyError(episode_index)
        return pos

    def files(self) -> dict[str, np.ndarray]:
        """Each data file and the positions of the episodes the metadata puts in it, in order."""
        out: dict[str, list[int]] = {}
        for p, rel in enumerate(self.data_file):
            out.setdefault(rel, []).append(p)
        return {rel: np.asarray(ps, dtype=np.int64) for rel, ps in out.items()}


def episode_list(indices) -> str:
    """'episode 4' or 'episodes 0, 1, 2' (the first few of many)."""
    indices = [int(i) for i in indices]
    if len(indices) == 1:
        return f"episode {indices[0]}"
    shown = ", ".join(str(i) for i in indices[:5])
    return f"episodes {shown}" + (f", ... ({len(indices)})" if len(indices) > 5 else "")


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) of each non-blank line; only '\\n' ends a line (a JSON string may hold U+2028)."""
    rows = []
    for n, line in enumerate(read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        row = parse_json(line, f"{path}:{n}")
        if not isinstance(row, dict):
            raise RobotDataError(f"{path}:{n}: expected a JSON object, got {show(row)}")
        rows.append((n, row))
    return rows


def read_table(path: Path, columns: list[str]):
    """Only ``columns`` of a metadata parquet file (v3.0 episode files also hold every episode's statistics)."""
    if not path.is_file():
        raise RobotDataError(f"{path}: file not found")
    try:
        names = pq.read_schema(path).names
    except Exception as e:  # pyarrow raises several types for damaged files
        raise RobotDataError(unreadable_parquet(path, e)) from None
    missing = [c for c in columns if c not in names]
    if missing:
        raise RobotDataError(f"{path}: missing column '{missing[0]}'")
    try:
        return pq.read_table(path, columns=columns)
    except Exception as e:
        raise RobotDataError(unreadable_parquet(path, e)) from None


class _Rows:
    """Episode rows as read, each with where it came from, checked field by field."""

    def __init__(self):
        self.where: list[str] = []  # "FILE row R" or "FILE:LINE"
        self.values: dict[str, list] = {}

    def add(self, where: str, values: dict) -> None:
        self.where.append(where)
        for k, v in values.items():
            self.values.setdefault(k, []).append(v)

    def ints(self, key: str, minimum: int) -> np.ndarray:
        for w, v in zip(self.where, self.values[key]):
            integer(v, f"{w}: '{key}'", minimum)
        return np.asarray(self.values[key], dtype=np.int64)


def load_v3(root: Path, data_path: str, video_path: str | None, video_keys: list[str],
            chunks_size: int | None) -> EpisodeTable:
    files = sorted((root / V3_EPISODES_DIR).glob("chunk-*/file-*.parquet"))
    if not files:
        raise RobotDataError(f"{root / V3_EPISODES_DIR}: no episode metadata files (chunk-*/file-*.parquet)")
    ints = ["episode_index", "length", "dataset_from_index", "dataset_to_index", "data/chunk_index",
            "data/file_index"]
    for key in video_keys:
        ints += [f"videos/{key}/chunk_index", f"videos/{key}/file_index"]
    floats = [f"videos/{key}/from_timestamp" for key in video_keys]
    rows = _Rows()
    for path in files:
        table = read_table(path, [*ints, *floats, "tasks"])
        cols = {c: expect_column(table, c, path, ("int",)) for c in ints}
        cols.update({c: expect_column(table, c, path, ("float", "int")) for c in floats})
        cols["tasks"] = expect_column(table, "tasks", path, ("strings",))
        for r in range(table.num_rows):
            rows.add(f"{path} row {r}", {c: v[r] for c, v in cols.items()})
    if not rows.where:
        raise RobotDataError(f"{root / V3_EPISODES_DIR}: the episode metadata lists no episodes")
    index = rows.ints("episode_index", 0)
    length = rows.ints("length", 1)
    start, end = rows.ints("dataset_from_index", 0), rows.ints("dataset_to_index", 0)
    for i in np.flatnonzero(end - start != length):
        raise RobotDataError(f"{rows.where[i]} (episode {index[i]}): dataset_from_index..dataset_to_index is "
                             f"{start[i]}..{end[i]} ({end[i] - start[i]} frames) but length is {length[i]}")
    chunk = {"data": (rows.ints("data/chunk_index", 0), rows.ints("data/file_index", 0))}
    for key in video_keys:
        chunk[key] = (rows.ints(f"videos/{key}/chunk_index", 0), rows.ints(f"videos/{key}/file_index", 0))
    if chunks_size is not None:
        for name, (_, file_index) in chunk.items():
            for i in np.flatnonzero(file_index >= chunks_size):
                col = "data/file_index" if name == "data" else f"videos/{name}/file_index"
                raise RobotDataError(f"{rows.where[i]} (episode {index[i]}): '{col}' is {file_index[i]}, but a chunk "
                                     f"holds {chunks_size} files (info.json chunks_size)")
    video_start = {}
    for key in video_keys:
        col = f"videos/{key}/from_timestamp"
        for w, v in zip(rows.where, rows.values[col]):
            if not math.isfinite(v) or v < 0:
                raise RobotDataError(f"{w}: '{col}' is {v}, expected a finite time in seconds >= 0")
        video_start[key] = np.asarray(rows.values[col], dtype=np.float64)
    tasks = [string_list(t, f"{w}: 'tasks'") for w, t in zip(rows.where, rows.values["tasks"])]
    order = _order(index, rows.where, root)
    _check_ranges(index[order], start[order], end[order], root)
    data_chunk, data_file = chunk["data"]
    return EpisodeTable(
        index=index[order], length=length[order], start=start[order],
        data_file=[data_path.format(chunk_index=int(data_chunk[i]), file_index=int(data_file[i])) for i in order],
        video_file={k: [video_path.format(video_key=k, chunk_index=int(chunk[k][0][i]), file_index=int(chunk[k][1][i]))
                        for i in order] for k in video_keys},
        video_start={k: v[order] for k, v in video_start.items()},
        tasks=[tasks[i] for i in order],
    )


def load_v21(root: Path, data_path: str, video_path: str | None, video_keys: list[str],
             chunks_size: int) -> EpisodeTable:
    path = root / V21_EPISODES_PATH
    rows = _Rows()
    for n, row in read_jsonl(path):
        for key in ("episode_index", "length"):
            if key not in row:
                raise RobotDataError(f"{path}:{n}: missing key '{key}'")
        tasks = string_list(row["tasks"], f"{path}:{n}: 'tasks'") if row.get("tasks") is not None else []
        rows.add(f"{path}:{n}", {"episode_index": row["episode_index"], "length": row["length"], "tasks": tasks})
    if not rows.where:
        raise RobotDataError(f"{path}: the episode metadata lists no episodes")
    index, length = rows.ints("episode_index", 0), rows.ints("length", 1)
    order = _order(index, rows.where, root)
    index, length = index[order], length[order]
    chunks = index // chunks_size
    return EpisodeTable(
        index=index,
        length=length,
        start=np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64),
        data_file=[data_path.format(episode_chunk=int(c), episode_index=int(e)) for c, e in zip(chunks, index)],
        video_file={k: [video_path.format(episode_chunk=int(c), video_key=k, episode_index=int(e))
                        for c, e in zip(chunks, index)] for k in video_keys},
        video_start={k: np.zeros(len(index)) for k in video_keys},
        tasks=[rows.values["tasks"][i] for i in order],
    )


def _order(index: np.ndarray, where: list[str], root: Path) -> np.ndarray:
    """Rows by episode_index; an index listed twice is refused (one of the two would be dropped)."""
    order = np.argsort(index, kind="stable")
    same = np.flatnonzero(np.diff(index[order]) == 0)
    if len(same):
        e = int(index[order[same[0]]])
        rows = [where[i] for i in order if index[i] == e]
        raise RobotDataError(f"{root}: episode_index {e} is listed {len(rows)} times in the episode metadata: "
                             + ", ".join(rows))
    return order


def _check_ranges(index: np.ndarray, start: np.ndarray, end: np.ndarray, root: Path) -> None:
    """Global frame ranges [dataset_from_index, dataset_to_index) of different episodes must not overlap."""
    by_start = np.argsort(start, kind="stable")
    for a, b in zip(by_start[:-1], by_start[1:]):
        if start[b] < end[a]:
            raise RobotDataError(f"{root}: episodes {index[a]} and {index[b]} overlap in the global frame index "
                                 f"(dataset_from_index..dataset_to_index {start[a]}..{end[a]} and "
                                 f"{start[b]}..{end[b]})")
