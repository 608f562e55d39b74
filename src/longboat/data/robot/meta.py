"""A LeRobot dataset's metadata: ``meta/info.json``, tasks, episodes and statistics, for v3.0 and v2.1.

Both layouts are read into one in-memory form: per-episode arrays (index, length, global frame range, data file,
and per camera the video file and the episode's start time in it) so the reader never asks which version it has.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from longboat.data.robot.errors import RobotDataError, UnknownFeatureError
from longboat.data.robot.features import Feature, parse_features
from longboat.data.robot.stats import aggregate_stats

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
SUPPORTED_VERSIONS = ("v3.0", "v2.1")
V3_TASKS_PATH = "meta/tasks.parquet"
V3_EPISODES_DIR = "meta/episodes"
V21_TASKS_PATH = "meta/tasks.jsonl"
V21_EPISODES_PATH = "meta/episodes.jsonl"
V21_EPISODES_STATS_PATH = "meta/episodes_stats.jsonl"


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


class DatasetMeta:
    """Reads and validates everything under ``meta/`` of a LeRobot v3.0 or v2.1 dataset at ``root``."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        info_path = self.root / INFO_PATH
        if not self.root.is_dir():
            why = "not a directory" if self.root.exists() else "no such directory"
            raise RobotDataError(f"{self.root}: not a LeRobot dataset ({why})")
        if not info_path.is_file():
            raise RobotDataError(f"{self.root}: not a LeRobot dataset ({INFO_PATH} not found)")
        self.info = _load_json(info_path)
        if not isinstance(self.info, dict):
            raise RobotDataError(f"{info_path}: expected a JSON object")
        self.version = self.info.get("codebase_version")
        if self.version not in SUPPORTED_VERSIONS:
            raise RobotDataError(f"{info_path}: codebase_version {self.version!r} is not supported "
                                 f"(expected one of {', '.join(SUPPORTED_VERSIONS)})")
        for key in ("fps", "data_path", "total_episodes", "total_frames"):
            if key not in self.info:
                raise RobotDataError(f"{info_path}: missing key '{key}'")
        fps = self.info["fps"]
        if not isinstance(fps, (int, float)) or fps <= 0:
            raise RobotDataError(f"{info_path}: 'fps' must be a positive number, got {fps!r}")
        self.fps = fps
        self.features: dict[str, Feature] = parse_features(self.info.get("features"), str(info_path))
        self.video_keys = [k for k, f in self.features.items() if f.is_video]
        self.image_keys = [k for k, f in self.features.items() if f.is_image]
        if self.video_keys and not self.info.get("video_path"):
            raise RobotDataError(f"{info_path}: features {self.video_keys} are videos but 'video_path' is not set")
        self.tasks = self._load_tasks()
        self.episodes = self._load_episodes_v3() if self.version == "v3.0" else self._load_episodes_v21()
        if len(self.episodes.index) != self.info["total_episodes"]:
            raise RobotDataError(f"{info_path}: total_episodes is {self.info['total_episodes']} but the episode "
                                 f"metadata lists {len(self.episodes.index)}")
        self.stats = load_stats(self.root / STATS_PATH)
        if self.stats is None and (self.root / V21_EPISODES_STATS_PATH).is_file():
            # LeRobot 0.3 writes only per-episode statistics for v2.1 and aggregates them when it loads.
            rows = _read_jsonl(self.root / V21_EPISODES_STATS_PATH, ("episode_index", "stats"))
            self.stats = aggregate_stats([{k: {s: np.asarray(v) for s, v in st.items()} for k, st in r["stats"].items()}
                                          for r in rows])

    @property
    def camera_keys(self) -> list[str]:
        return self.video_keys + self.image_keys

    @property
    def total_frames(self) -> int:
        return int(self.episodes.length.sum())

    def feature(self, key: str) -> Feature:
        if key not in self.features:
            raise UnknownFeatureError(f"{self.root}: feature '{key}' does not exist (features: "
                                      f"{', '.join(self.features)})")
        return self.features[key]

    def _load_tasks(self) -> list[str]:
        """Task strings ordered by task_index."""
        if self.version == "v3.0":
            path = self.root / V3_TASKS_PATH
            table = _read_parquet(path)
            if "task_index" not in table.column_names:
                raise RobotDataError(f"{path}: missing column 'task_index'")
            # pandas writes the index (the task strings) as a column named by the schema's pandas metadata.
            names = [c for c in table.column_names if c != "task_index"]
            if not names:
                raise RobotDataError(f"{path}: no task column besides 'task_index'")
            col = "__index_level_0__" if "__index_level_0__" in names else ("task" if "task" in names else names[0])
            pairs = zip(table.column("task_index").to_pylist(), table.column(col).to_pylist())
        else:
            path = self.root / V21_TASKS_PATH
            pairs = ((row["task_index"], row["task"]) for row in _read_jsonl(path, ("task_index", "task")))
        by_index = dict(pairs)
        if sorted(by_index) != list(range(len(by_index))):
            raise RobotDataError(f"{path}: task_index values must be 0..{len(by_index) - 1}, got {sorted(by_index)}")
        return [by_index[i] for i in range(len(by_index))]

    def _load_episodes_v3(self) -> EpisodeTable:
        files = sorted((self.root / V3_EPISODES_DIR).glob("chunk-*/file-*.parquet"))
        if not files:
            raise RobotDataError(f"{self.root / V3_EPISODES_DIR}: no episode metadata files (chunk-*/file-*.parquet)")
        needed = ["episode_index", "length", "tasks", "dataset_from_index", "dataset_to_index",
                  "data/chunk_index", "data/file_index"]
        for key in self.video_keys:
            needed += [f"videos/{key}/chunk_index", f"videos/{key}/file_index", f"videos/{key}/from_timestamp"]
        cols: dict[str, list] = {c: [] for c in needed}
        for path in files:
            table = _read_parquet(path)
            for c in needed:
                if c not in table.column_names:
                    raise RobotDataError(f"{path}: missing column '{c}'")
                cols[c] += table.column(c).to_pylist()
        order = np.argsort(np.asarray(cols["episode_index"], dtype=np.int64), kind="stable")
        col = {c: [v[i] for i in order] for c, v in cols.items()}
        data_path = self.info["data_path"]
        return EpisodeTable(
            index=np.asarray(col["episode_index"], dtype=np.int64),
            length=np.asarray(col["length"], dtype=np.int64),
            start=np.asarray(col["dataset_from_index"], dtype=np.int64),
            data_file=[data_path.format(chunk_index=c, file_index=f)
                       for c, f in zip(col["data/chunk_index"], col["data/file_index"])],
            video_file={k: [self.info["video_path"].format(video_key=k, chunk_index=c, file_index=f)
                            for c, f in zip(col[f"videos/{k}/chunk_index"], col[f"videos/{k}/file_index"])]
                        for k in self.video_keys},
            video_start={k: np.asarray(col[f"videos/{k}/from_timestamp"], dtype=np.float64) for k in self.video_keys},
            tasks=col["tasks"],
        )

    def _load_episodes_v21(self) -> EpisodeTable:
        rows = sorted(_read_jsonl(self.root / V21_EPISODES_PATH, ("episode_index", "length")),
                      key=lambda r: r["episode_index"])
        index = np.asarray([r["episode_index"] for r in rows], dtype=np.int64)
        length = np.asarray([r["length"] for r in rows], dtype=np.int64)
        chunks = index // int(self.info.get("chunks_size", 1000))
        data_path, video_path = self.info["data_path"], self.info.get("video_path")
        return EpisodeTable(
            index=index,
            length=length,
            start=np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64),
            data_file=[data_path.format(episode_chunk=c, episode_index=e) for c, e in zip(chunks, index)],
            video_file={k: [video_path.format(episode_chunk=c, video_key=k, episode_index=e)
                            for c, e in zip(chunks, index)] for k in self.video_keys},
            video_start={k: np.zeros(len(index)) for k in self.video_keys},
            tasks=[list(r.get("tasks") or []) for r in rows],
        )


def load_stats(path: Path) -> dict[str, dict[str, np.ndarray]] | None:
    """``meta/stats.json`` as arrays (``None`` when the dataset has none)."""
    if not path.is_file():
        return None
    raw = _load_json(path)
    if not isinstance(raw, dict):
        raise RobotDataError(f"{path}: expected a JSON object of feature -> statistics")
    return {k: {s: np.asarray(v) for s, v in st.items()} for k, st in raw.items()}


def _load_json(path: Path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RobotDataError(f"{path}: not valid JSON ({e})") from None


def _read_jsonl(path: Path, required: tuple[str, ...]) -> list[dict]:
    if not path.is_file():
        raise RobotDataError(f"{path}: file not found")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise RobotDataError(f"{path}:{n}: not valid JSON ({e})") from None
        missing = [k for k in required if k not in row]
        if missing:
            raise RobotDataError(f"{path}:{n}: missing key '{missing[0]}'")
        rows.append(row)
    return rows


def _read_parquet(path: Path, columns: list[str] | None = None, filters=None):
    if not path.is_file():
        raise RobotDataError(f"{path}: file not found")
    try:
        return pq.read_table(path, columns=columns, filters=filters, memory_map=True)
    except Exception as e:  # pyarrow raises several types for damaged files
        raise RobotDataError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from None


def check_parquet_footer(path: Path) -> None:
    """Reads only the footer: a missing, truncated or foreign file fails here without reading its rows."""
    if not path.is_file():
        raise RobotDataError(f"{path}: file not found")
    try:
        pq.read_metadata(path)
    except Exception as e:  # pyarrow raises several types for damaged files
        raise RobotDataError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from None


def read_frames(root: Path, rel_path: str, episodes: np.ndarray | None):
    """Rows of one data file, only of ``episodes`` when given."""
    filters = pc.field("episode_index").isin(episodes.tolist()) if episodes is not None else None
    return _read_parquet(root / rel_path, filters=filters)
