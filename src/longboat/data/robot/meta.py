"""A LeRobot dataset's metadata: ``meta/info.json``, tasks, episodes and statistics, for v3.0 and v2.1.

Opening a dataset checks what is cheap to check: every value's type, the counts of info.json against the
episode metadata, and each data file's parquet footer (its columns and its row count against the episode
lengths), so a wrong dataset fails in one line before any work. ``longboat data info --check`` reads the rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from longboat.data.robot.episodes import (V3_EPISODES_DIR, V21_EPISODES_PATH, EpisodeTable, episode_list, load_v3,
                                          load_v21, read_jsonl, read_table)
from longboat.data.robot.errors import RobotDataError, UnknownFeatureError, VideoDecodeError
from longboat.data.robot.features import Feature, check_default_features, column_problems, parse_features
from longboat.data.robot.fields import (expect_column, integer, load_json, numeric_array, path_template,
                                        positive_number, show, unreadable_parquet)
from longboat.data.robot.stats import aggregate_stats

__all__ = ["DatasetMeta", "EpisodeTable", "V3_EPISODES_DIR", "V21_EPISODES_PATH", "check_parquet_footer",
           "data_file_problems", "load_stats", "read_frames"]

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
SUPPORTED_VERSIONS = ("v3.0", "v2.1")
V3_TASKS_PATH = "meta/tasks.parquet"
V21_TASKS_PATH = "meta/tasks.jsonl"
V21_EPISODES_STATS_PATH = "meta/episodes_stats.jsonl"
# The placeholders of data_path and video_path in each layout.
PLACEHOLDERS = {
    "v3.0": (("chunk_index", "file_index"), ("video_key", "chunk_index", "file_index")),
    "v2.1": (("episode_chunk", "episode_index"), ("episode_chunk", "video_key", "episode_index")),
}
AGGREGATED_STATS = ("min", "max", "mean", "std", "count")  # what v2.1's per-episode statistics must hold


class DatasetMeta:
    """Reads and validates everything under ``meta/`` of a LeRobot v3.0 or v2.1 dataset at ``root``;
    ``check_files``: also each data file's footer (``data info --check`` lists those problems itself)."""

    def __init__(self, root: str | Path, check_files: bool = True):
        self.root = Path(root)
        info_path = self.root / INFO_PATH
        if not self.root.is_dir():
            why = "not a directory" if self.root.exists() else "no such directory"
            raise RobotDataError(f"{self.root}: not a LeRobot dataset ({why})")
        if not info_path.is_file():
            raise RobotDataError(f"{self.root}: not a LeRobot dataset ({INFO_PATH} not found)")
        self.info = load_json(info_path)
        if not isinstance(self.info, dict):
            raise RobotDataError(f"{info_path}: expected a JSON object")
        self.version = self.info.get("codebase_version")
        if not isinstance(self.version, str) or self.version not in SUPPORTED_VERSIONS:
            raise RobotDataError(f"{info_path}: codebase_version {show(self.version)} is not supported "
                                 f"(expected one of {', '.join(SUPPORTED_VERSIONS)})")
        for key in ("fps", "data_path", "total_episodes", "total_frames"):
            if key not in self.info:
                raise RobotDataError(f"{info_path}: missing key '{key}'")
        self.fps = positive_number(self.info["fps"], f"{info_path}: 'fps'")
        self.features: dict[str, Feature] = parse_features(self.info.get("features"), str(info_path))
        check_default_features(self.features, str(info_path))
        self.video_keys = [k for k, f in self.features.items() if f.is_video]
        self.image_keys = [k for k, f in self.features.items() if f.is_image]
        data_keys, video_keys = PLACEHOLDERS[self.version]
        data_path = path_template(self.info["data_path"], f"{info_path}: 'data_path'", data_keys)
        video_path = None
        if self.video_keys:
            if not self.info.get("video_path"):
                raise RobotDataError(f"{info_path}: features {self.video_keys} are videos but 'video_path' is not set")
            video_path = path_template(self.info["video_path"], f"{info_path}: 'video_path'", video_keys)
        chunks_size = self.info.get("chunks_size")
        if chunks_size is not None:
            chunks_size = integer(chunks_size, f"{info_path}: 'chunks_size'", 1)
        total_episodes = integer(self.info["total_episodes"], f"{info_path}: 'total_episodes'", 0)
        total_frames = integer(self.info["total_frames"], f"{info_path}: 'total_frames'", 0)
        self.tasks = self._load_tasks()
        if "total_tasks" in self.info:
            total_tasks = integer(self.info["total_tasks"], f"{info_path}: 'total_tasks'", 0)
            if total_tasks != len(self.tasks):
                raise RobotDataError(f"{info_path}: total_tasks is {total_tasks} but {self._tasks_path} lists "
                                     f"{len(self.tasks)}")
        if self.version == "v3.0":
            self.episodes = load_v3(self.root, data_path, video_path, self.video_keys, chunks_size)
        else:
            self.episodes = load_v21(self.root, data_path, video_path, self.video_keys, chunks_size or 1000)
            self._check_total_chunks(info_path, chunks_size or 1000)
        if len(self.episodes.index) != total_episodes:
            raise RobotDataError(f"{info_path}: total_episodes is {total_episodes} but the episode "
                                 f"metadata lists {len(self.episodes.index)}")
        if self.total_frames != total_frames:
            raise RobotDataError(f"{info_path}: total_frames is {total_frames} but the episode lengths in the "
                                 f"episode metadata add up to {self.total_frames}")
        self.stats = load_stats(self.root / STATS_PATH, self.features)
        if self.stats is None and (self.root / V21_EPISODES_STATS_PATH).is_file():
            # LeRobot 0.3 writes only per-episode statistics for v2.1 and aggregates them when it loads.
            self.stats = _aggregate_episode_stats(self.root / V21_EPISODES_STATS_PATH, self.features)
        if check_files:
            problems = data_file_problems(self)
            if problems:
                raise RobotDataError(problems[0])

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

    def video_paths(self, key: str, positions) -> dict[int, Path]:
        """The video file of camera ``key`` for each episode position, each checked to exist: a missing file fails
        now, not in a loader worker hours later."""
        paths = {rel: self.root / rel for rel in dict.fromkeys(self.episodes.video_file[key][p] for p in positions)}
        for path in paths.values():
            if not path.is_file():
                raise VideoDecodeError(f"{path}: video file of '{key}' not found")
        return {int(p): paths[self.episodes.video_file[key][p]] for p in positions}

    @property
    def _tasks_path(self) -> Path:
        return self.root / (V3_TASKS_PATH if self.version == "v3.0" else V21_TASKS_PATH)

    def _load_tasks(self) -> list[str]:
        """Task strings ordered by task_index."""
        path = self._tasks_path
        if self.version == "v3.0":
            names = _parquet_names(path)
            if "task_index" not in names:
                raise RobotDataError(f"{path}: missing column 'task_index'")
            # pandas writes the index (the task strings) as a column named by the schema's pandas metadata.
            others = [c for c in names if c != "task_index"]
            if not others:
                raise RobotDataError(f"{path}: no task column besides 'task_index'")
            col = "__index_level_0__" if "__index_level_0__" in others else ("task" if "task" in others else others[0])
            table = read_table(path, ["task_index", col])
            pairs = zip(expect_column(table, "task_index", path, ("int",)),
                        expect_column(table, col, path, ("string",)))
            rows = [(f"{path} row {r}", i, t) for r, (i, t) in enumerate(pairs)]
        else:
            rows = []
            for n, row in read_jsonl(path):
                for key in ("task_index", "task"):
                    if key not in row:
                        raise RobotDataError(f"{path}:{n}: missing key '{key}'")
                if not isinstance(row["task"], str):
                    raise RobotDataError(f"{path}:{n}: 'task': expected a string, got {show(row['task'])}")
                rows.append((f"{path}:{n}", row["task_index"], row["task"]))
        by_index: dict[int, tuple[str, str]] = {}
        for where, i, task in rows:
            i = integer(i, f"{where}: 'task_index'", 0)
            if i in by_index:
                raise RobotDataError(f"{path}: task_index {i} is listed twice ({by_index[i][0]}, {where})")
            by_index[i] = (where, task)
        if sorted(by_index) != list(range(len(by_index))):
            raise RobotDataError(f"{path}: task_index values must be 0..{len(by_index) - 1}, got {sorted(by_index)}")
        return [by_index[i][1] for i in range(len(by_index))]

    def _check_total_chunks(self, info_path: Path, chunks_size: int) -> None:
        """v2.1 keeps episode i in chunk i // chunks_size: info.json's total_chunks must count them."""
        if "total_chunks" not in self.info:
            return
        total = integer(self.info["total_chunks"], f"{info_path}: 'total_chunks'", 0)
        needed = int(self.episodes.index.max()) // chunks_size + 1
        if total != needed:
            raise RobotDataError(f"{info_path}: total_chunks is {total} but episodes 0..{self.episodes.index.max()} "
                                 f"with chunks_size {chunks_size} fill {needed}")


def _parquet_names(path: Path) -> list[str]:
    if not path.is_file():
        raise RobotDataError(f"{path}: file not found")
    try:
        return pq.read_schema(path).names
    except Exception as e:  # pyarrow raises several types for damaged files
        raise RobotDataError(unreadable_parquet(path, e)) from None


def load_stats(path: Path, features: dict[str, Feature] | None = None) -> dict[str, dict[str, np.ndarray]] | None:
    """``meta/stats.json`` as arrays (``None`` when the dataset has none), shaped as ``features`` say."""
    if not path.is_file():
        return None
    return parse_stats(load_json(path), str(path), features or {})


def parse_stats(raw: object, source: str, features: dict[str, Feature]) -> dict[str, dict[str, np.ndarray]]:
    """Feature -> statistic -> finite numbers; a feature's statistics have its shape (cameras: [C, 1, 1])."""
    if not isinstance(raw, dict):
        raise RobotDataError(f"{source}: expected a JSON object of feature -> statistics, got {show(raw)}")
    out = {}
    for key, stats in raw.items():
        if not isinstance(stats, dict):
            raise RobotDataError(f"{source}: '{key}': expected a mapping of statistic -> values, got {show(stats)}")
        ft = features.get(key)
        out[key] = {}
        for name, value in stats.items():
            arr = numeric_array(value, f"{source}: {key}.{name}")
            if ft is not None and ft.dtype != "string":
                if name == "count":
                    ok, want = arr.size == 1, "one number"
                elif ft.is_visual:
                    ok, want = arr.shape == (ft.channels, 1, 1), f"shape {[ft.channels, 1, 1]} (per channel)"
                else:
                    ok = arr.shape == ft.shape or (ft.is_scalar and arr.shape == ())
                    want = f"the feature's shape {list(ft.shape)}"
                if not ok:
                    raise RobotDataError(f"{source}: {key}.{name} has shape {list(arr.shape)}, expected {want}")
            out[key][name] = arr
    return out


def _aggregate_episode_stats(path: Path, features: dict[str, Feature]) -> dict[str, dict[str, np.ndarray]]:
    parts: list[dict[str, dict[str, np.ndarray]]] = []
    first: dict[tuple[str, str], tuple[str, tuple]] = {}  # (feature, stat) -> (where, shape) of its first row
    for n, row in read_jsonl(path):
        where = f"{path}:{n}"
        if "stats" not in row:
            raise RobotDataError(f"{where}: missing key 'stats'")
        stats = parse_stats(row["stats"], where, features)
        for key, st in stats.items():
            for name in AGGREGATED_STATS:
                if name not in st:
                    raise RobotDataError(f"{where}: {key} lacks '{name}' (needed to aggregate episode statistics)")
            if st["count"].reshape(-1)[0] <= 0:
                raise RobotDataError(f"{where}: {key}.count is {st['count'].reshape(-1)[0]}, expected a count >= 1")
            for name, arr in st.items():
                seen = first.setdefault((key, name), (where, arr.shape))
                if seen[1] != arr.shape:
                    raise RobotDataError(f"{where}: {key}.{name} has shape {list(arr.shape)}, {seen[0]} has "
                                         f"{list(seen[1])}")
        parts.append(stats)
    return aggregate_stats(parts)


def check_parquet_footer(path: Path):
    """Reads only the footer: a missing, truncated or foreign file fails here without reading its rows."""
    if not path.is_file():
        raise RobotDataError(f"{path}: file not found")
    try:
        return pq.read_metadata(path)
    except Exception as e:  # pyarrow raises several types for damaged files
        raise RobotDataError(unreadable_parquet(path, e)) from None


def data_file_problems(meta: DatasetMeta) -> list[str]:
    """What the data files' footers say against the metadata: a file missing or unreadable, a column missing or of
    another shape, a row count other than the lengths of the episodes the metadata puts in the file."""
    problems = []
    eps = meta.episodes
    for rel, positions in eps.files().items():
        path = meta.root / rel
        try:
            footer = check_parquet_footer(path)
            schema = footer.schema.to_arrow_schema()
        except RobotDataError as e:
            problems.append(str(e))
            continue
        except Exception as e:  # a footer whose schema arrow cannot map
            problems.append(unreadable_parquet(path, e))
            continue
        problems += column_problems(meta.features, schema, path)
        expected = int(eps.length[positions].sum())
        if footer.num_rows != expected:
            lengths = ", ".join(str(n) for n in eps.length[positions][:5]) + (", ..." if len(positions) > 5 else "")
            problems.append(f"{path}: holds {footer.num_rows} rows but the episode metadata puts {expected} in it "
                            f"({episode_list(eps.index[positions])} of length{'s' * (len(positions) > 1)} {lengths})")
    return problems


def read_frames(root: Path, rel_path: str, episodes: np.ndarray | None):
    """Rows of one data file, only of ``episodes`` when given."""
    path = root / rel_path
    if not path.is_file():
        raise RobotDataError(f"{path}: file not found")
    filters = pc.field("episode_index").isin(episodes.tolist()) if episodes is not None else None
    try:
        return pq.read_table(path, filters=filters, memory_map=True)
    except Exception as e:  # pyarrow raises several types for damaged files
        raise RobotDataError(unreadable_parquet(path, e)) from None
