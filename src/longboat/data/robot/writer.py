"""``RobotDatasetWriter``: record frames and episodes into a LeRobot v3.0 dataset.

Everything is written into a hidden directory beside the target and renamed into place when the writer closes,
so the target is either absent or a complete dataset. Closing after an error (the context manager does it)
drops the unfinished episode and keeps the saved ones; a killed process leaves no target at all.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from longboat.data.robot.encode import VideoFileEncoder, VideoOptions, video_info
from longboat.data.robot.errors import RobotDataError
from longboat.data.robot.features import DEFAULT_FEATURES, Feature, parse_features
from longboat.data.robot.meta import INFO_PATH, STATS_PATH, V3_TASKS_PATH
from longboat.data.robot.stats import aggregate_stats, image_stats, stats_to_json, vector_stats

DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
MB = 1024**2


class _FileSlot:
    """The (chunk, file) index a file-per-size sequence is at; a chunk holds ``chunks_size`` files."""

    def __init__(self, chunks_size: int):
        self.chunks_size, self.chunk, self.file = chunks_size, 0, 0

    def advance(self) -> None:
        self.file += 1
        if self.file == self.chunks_size:
            self.chunk, self.file = self.chunk + 1, 0


class RobotDatasetWriter:
    """Writes a v3.0 dataset at ``root`` (which must not exist) with ``features`` as LeRobot declares them.

    Use it as a context manager, or end with ``close()`` (or ``abort()``): until then the files live in the
    hidden directory beside ``root``.
    """

    def __init__(
        self,
        root: str | Path,
        fps: int,
        features: dict[str, dict],
        robot_type: str | None = None,
        video: VideoOptions | None = None,
        chunks_size: int = 1000,
        data_files_size_in_mb: float = 100,
        video_files_size_in_mb: float = 200,
    ):
        self.root = Path(root)
        if self.root.exists():
            raise RobotDataError(f"{self.root}: already exists; the writer creates a new dataset")
        if not isinstance(fps, int) or fps <= 0:
            raise RobotDataError(f"{self.root}: fps must be a positive integer, got {fps!r}")
        reserved = set(features) & set(DEFAULT_FEATURES)
        if reserved:
            raise RobotDataError(f"{self.root}: features {sorted(reserved)} are added by the writer itself")
        self.features: dict[str, Feature] = parse_features({**features, **DEFAULT_FEATURES}, str(self.root))
        strings = [k for k, f in self.features.items() if f.dtype == "string"]
        if strings:
            raise RobotDataError(f"{self.root}: string features {strings} are not supported by the writer")
        self.fps, self.robot_type = fps, robot_type
        self.video = video or VideoOptions()
        self.chunks_size = chunks_size
        self.files_size_in_mb = {"data_files_size_in_mb": data_files_size_in_mb,
                                 "video_files_size_in_mb": video_files_size_in_mb}
        self.data_limit, self.video_limit = data_files_size_in_mb * MB, video_files_size_in_mb * MB
        self.video_keys = [k for k, f in self.features.items() if f.is_video]
        self.tmp = self.root.parent / f".{self.root.name}.partial-{os.getpid()}"
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        self.schema = pa.schema([(k, f.arrow_type()) for k, f in self.features.items() if not f.is_video])
        self.tasks: dict[str, int] = {}
        self.episodes: list[dict] = []
        self.episode_stats: list[dict] = []
        self.total_frames = 0
        self._buffer: dict[str, list] = {}
        self._timestamps: list[float] = []
        self._frame_tasks: list[str] = []
        self._data_slot, self._data_writer, self._data_bytes = _FileSlot(chunks_size), None, 0
        self._video_slot = {k: _FileSlot(chunks_size) for k in self.video_keys}
        self._video_enc: dict[str, VideoFileEncoder | None] = dict.fromkeys(self.video_keys)
        self._video_info: dict[str, dict] = {}
        self._closed = False

    # recording -----------------------------------------------------------------------------------------------
    def add_frame(self, frame: dict, task: str, timestamp: float | None = None) -> None:
        """Buffer one frame: a value for every feature (images uint8 [H, W, C] or float [C, H, W] in [0, 1])."""
        expected = [k for k in self.features if k not in DEFAULT_FEATURES]
        missing, extra = set(expected) - set(frame), set(frame) - set(expected)
        if missing or extra:
            raise RobotDataError(f"{self.root}: frame {len(self._timestamps)}: "
                                 + (f"missing features {sorted(missing)}" if missing else "")
                                 + ("; " if missing and extra else "")
                                 + (f"unknown features {sorted(extra)}" if extra else ""))
        if not isinstance(task, str) or not task:
            raise RobotDataError(f"{self.root}: frame {len(self._timestamps)}: task must be a non-empty string")
        checked = {key: self._check_value(self.features[key], frame[key]) for key in expected}
        for key, value in checked.items():  # only a frame that passed every check is buffered
            self._buffer.setdefault(key, []).append(value)
        self._timestamps.append(len(self._timestamps) / self.fps if timestamp is None else float(timestamp))
        self._frame_tasks.append(task)

    def _check_value(self, ft: Feature, value) -> np.ndarray:
        if hasattr(value, "detach"):  # torch tensors
            value = value.detach().cpu().numpy()
        arr = np.asarray(value)
        if ft.is_visual:
            h, w, c = ft.shape if ft.shape[-1] in (1, 3) else (ft.shape[1], ft.shape[2], ft.shape[0])
            if arr.shape == (c, h, w) and np.issubdtype(arr.dtype, np.floating):
                arr = np.round(np.clip(arr, 0, 1) * 255).astype(np.uint8).transpose(1, 2, 0)
            if arr.shape != (h, w, c) or arr.dtype != np.uint8:
                raise RobotDataError(f"{self.root}: feature '{ft.name}': expected uint8 [{h}, {w}, {c}] or float "
                                     f"[{c}, {h}, {w}] in [0, 1], got {arr.dtype} {list(arr.shape)}")
            return arr
        if ft.is_scalar and arr.shape == ():
            arr = arr.reshape(1)
        if arr.shape != ft.shape:
            raise RobotDataError(f"{self.root}: feature '{ft.name}': expected shape {list(ft.shape)}, "
                                 f"got {list(arr.shape)}")
        if not np.can_cast(arr.dtype, ft.numpy_dtype, casting="same_kind"):
            raise RobotDataError(f"{self.root}: feature '{ft.name}': expected {ft.dtype}, got {arr.dtype}")
        return arr.astype(ft.numpy_dtype, copy=False)

    def clear_episode(self) -> None:
        """Drop the frames buffered since the last ``save_episode``."""
        self._buffer, self._timestamps, self._frame_tasks = {}, [], []

    def save_episode(self) -> int:
        """Write the buffered frames as the next episode; returns its episode_index."""
        n = len(self._timestamps)
        if n == 0:
            raise RobotDataError(f"{self.root}: save_episode with no frames added")
        ep = len(self.episodes)
        for t in dict.fromkeys(self._frame_tasks):
            self.tasks.setdefault(t, len(self.tasks))
        columns = {k: np.stack(v) for k, v in self._buffer.items()}
        columns["timestamp"] = np.asarray(self._timestamps, dtype=np.float32)
        columns["frame_index"] = np.arange(n, dtype=np.int64)
        columns["episode_index"] = np.full(n, ep, dtype=np.int64)
        columns["index"] = np.arange(self.total_frames, self.total_frames + n, dtype=np.int64)
        columns["task_index"] = np.asarray([self.tasks[t] for t in self._frame_tasks], dtype=np.int64)
        stats = {k: image_stats(v) if self.features[k].is_visual else vector_stats(v) for k, v in columns.items()}
        row = {"episode_index": ep, "tasks": list(dict.fromkeys(self._frame_tasks)), "length": n,
               **self._write_data(columns), "dataset_from_index": self.total_frames,
               "dataset_to_index": self.total_frames + n}
        for key in self.video_keys:
            row.update(self._write_video(key, columns[key]))
        row.update({f"stats/{k}/{s}": v for k, st in stats.items() for s, v in st.items()})
        self.episodes.append(row)
        self.episode_stats.append(stats)
        self.total_frames += n
        self.clear_episode()
        return ep

    def _write_data(self, columns: dict[str, np.ndarray]) -> dict:
        arrays = [_to_arrow(columns[k], self.features[k]) for k in self.schema.names]
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        if self._data_writer is not None and self._data_bytes + table.nbytes >= self.data_limit:
            self._data_writer.close()
            self._data_writer, self._data_bytes = None, 0
            self._data_slot.advance()
        slot = self._data_slot
        if self._data_writer is None:
            path = self.tmp / DATA_PATH.format(chunk_index=slot.chunk, file_index=slot.file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._data_writer = pq.ParquetWriter(path, self.schema, compression="snappy")
        self._data_writer.write_table(table)
        self._data_bytes += table.nbytes
        return {"data/chunk_index": slot.chunk, "data/file_index": slot.file}

    def _write_video(self, key: str, frames: np.ndarray) -> dict:
        enc, slot = self._video_enc[key], self._video_slot[key]
        if enc is not None and enc.estimated_bytes(len(frames)) >= self.video_limit:
            self._close_video(key)
            slot.advance()
            enc = None
        if enc is None:
            path = self.tmp / VIDEO_PATH.format(video_key=key, chunk_index=slot.chunk, file_index=slot.file)
            enc = self._video_enc[key] = VideoFileEncoder(path, self.fps, frames.shape[2], frames.shape[1],
                                                          self.video)
        start = enc.frames / self.fps
        enc.add(frames)
        return {f"videos/{key}/chunk_index": slot.chunk, f"videos/{key}/file_index": slot.file,
                f"videos/{key}/from_timestamp": start, f"videos/{key}/to_timestamp": enc.frames / self.fps}

    def _close_video(self, key: str) -> None:
        enc = self._video_enc[key]
        if enc is not None:
            enc.close()
            self._video_info.setdefault(key, video_info(enc.path))
            self._video_enc[key] = None

    # finishing -----------------------------------------------------------------------------------------------
    def close(self) -> Path:
        """Finish the files, write the metadata and move the dataset into place; returns its root."""
        if self._closed:
            return self.root
        self._closed = True
        if not self.episodes:
            self.abort()
            raise RobotDataError(f"{self.root}: no episode was saved; nothing written")
        if self._data_writer is not None:
            self._data_writer.close()
        for key in self.video_keys:
            self._close_video(key)
        self._write_episodes()
        _write_tasks(self.tmp / V3_TASKS_PATH, self.tasks)
        (self.tmp / STATS_PATH).write_text(json.dumps(stats_to_json(aggregate_stats(self.episode_stats)), indent=4))
        (self.tmp / INFO_PATH).write_text(json.dumps(self._info(), indent=4))
        if self.root.exists():
            raise RobotDataError(f"{self.root}: appeared while writing; the dataset is left in {self.tmp}")
        os.rename(self.tmp, self.root)
        return self.root

    def abort(self) -> None:
        """Discard everything written so far."""
        self._closed = True
        if self._data_writer is not None:
            self._data_writer.close()
        for enc in self._video_enc.values():
            if enc is not None:
                enc.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "RobotDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        elif self.episodes:  # keep the saved episodes; the unfinished one is dropped
            self.clear_episode()
            self.close()
        else:
            self.abort()

    def _write_episodes(self) -> None:
        slot, rows, size = _FileSlot(self.chunks_size), [], 0
        batches: list[tuple[int, int, list[dict]]] = []
        for row in self.episodes:
            row_bytes = sum(np.asarray(v).nbytes if not isinstance(v, (str, list)) else 64 for v in row.values())
            if rows and size + row_bytes >= self.data_limit:
                batches.append((slot.chunk, slot.file, rows))
                slot.advance()
                rows, size = [], 0
            rows.append(row)
            size += row_bytes
        batches.append((slot.chunk, slot.file, rows))
        for chunk, file, rows in batches:
            cols: dict[str, list] = {}
            for row in rows:
                for k, v in {**row, "meta/episodes/chunk_index": chunk, "meta/episodes/file_index": file}.items():
                    cols.setdefault(k, []).append(v.tolist() if isinstance(v, np.ndarray) else v)
            path = self.tmp / EPISODES_PATH.format(chunk_index=chunk, file_index=file)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table(cols), path)

    def _info(self) -> dict:
        features = {}
        for key, ft in self.features.items():
            features[key] = ft.to_json()
            if ft.is_video:
                features[key]["info"] = self._video_info[key]
        return {
            "codebase_version": "v3.0", "robot_type": self.robot_type, "total_episodes": len(self.episodes),
            "total_frames": self.total_frames, "total_tasks": len(self.tasks), "chunks_size": self.chunks_size,
            **self.files_size_in_mb,
            "fps": self.fps, "splits": {"train": f"0:{len(self.episodes)}"}, "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self.video_keys else None, "features": features,
        }


def _to_arrow(values: np.ndarray | list, ft: Feature) -> pa.Array:
    if ft.is_image:
        return pa.array([{"bytes": _png(v), "path": None} for v in values], type=ft.arrow_type())
    arr = np.asarray(values)
    if ft.is_scalar:
        return pa.array(arr.reshape(len(arr)), type=ft.arrow_type())
    types = [ft.arrow_type()]
    while pa.types.is_fixed_size_list(types[-1]):
        types.append(types[-1].value_type)
    out: pa.Array = pa.array(arr.reshape(-1), type=types.pop())
    while types:
        out = pa.FixedSizeListArray.from_arrays(out, type=types.pop())
    return out


def _png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def _write_tasks(path: Path, tasks: dict[str, int]) -> None:
    """``meta/tasks.parquet`` as pandas writes LeRobot's frame: the task strings are the index."""
    pandas_meta = {
        "index_columns": ["__index_level_0__"], "column_indexes": [],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object",
             "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": "2.2.3",
    }
    schema = pa.schema([("task_index", pa.int64()), ("__index_level_0__", pa.string())],
                       metadata={b"pandas": json.dumps(pandas_meta).encode()})
    table = pa.Table.from_arrays([pa.array(list(tasks.values()), pa.int64()), pa.array(list(tasks), pa.string())],
                                 schema=schema)
    pq.write_table(table, path)
