"""``longboat data info --check``: read every data file and open every video, and list each problem found.

Opening a dataset checks only what its metadata and the files' footers say; this reads the rows: parquet columns,
each episode's rows, frame_index 0..length-1 and the global index in row order, timestamps finite and increasing,
task_index within the tasks, no null, NaN or infinite value, data files no episode points to; and each video:
present, a decodable first frame, the size info.json gives, long enough for the episodes it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from longboat.data.robot.episodes import episode_list
from longboat.data.robot.errors import RobotDataError
from longboat.data.robot.fields import one_line, unreadable_parquet
from longboat.data.robot.meta import DatasetMeta, check_parquet_footer, data_file_problems

INDEX_COLUMNS = ("episode_index", "frame_index", "index", "timestamp", "task_index")
BATCH_ROWS = 65536  # a file is read in batches of rows: an image column holds megabytes per batch at most


@dataclass
class CheckReport:
    data_files: int = 0
    rows: int = 0
    video_files: int = 0
    problems: list[str] = field(default_factory=list)

    def text(self) -> str:
        files = (f"{self.data_files} data file{'s' * (self.data_files != 1)} ({self.rows} rows), "
                 f"{self.video_files} video file{'s' * (self.video_files != 1)}")
        found = f"{len(self.problems)} problem{'s' * (len(self.problems) != 1)}" if self.problems else "no problems"
        return "\n".join([f"checked   {files}: {found}", *(f"  {p}" for p in self.problems)])


def check_dataset(meta: DatasetMeta, tolerance_s: float = 1e-4) -> CheckReport:
    """Every problem of the data and video files of a dataset whose metadata opened (``check_files=False``)."""
    report = CheckReport(problems=data_file_problems(meta))
    files = meta.episodes.files()
    for rel, positions in files.items():
        report.data_files += 1
        report.rows += _check_data_file(meta, meta.root / rel, positions, report.problems)
    report.problems += _unreferenced(meta, set(files))
    for key in meta.video_keys:
        by_file: dict[str, list[int]] = {}
        for p, rel in enumerate(meta.episodes.video_file[key]):
            by_file.setdefault(rel, []).append(p)
        for rel, positions in by_file.items():
            report.video_files += 1
            report.problems += _check_video(meta, key, meta.root / rel, positions, tolerance_s)
    return report


def _check_data_file(meta: DatasetMeta, path: Path, positions: np.ndarray, problems: list[str]) -> int:
    """Reads the whole file in batches (every page decoded, only the index columns kept); returns its row count."""
    try:
        check_parquet_footer(path)
    except RobotDataError:
        return 0  # listed with the footers
    kept: dict[str, list[np.ndarray]] = {}
    nulls: dict[str, int] = {}
    non_finite: dict[str, int] = {}  # NaN or infinity in a float column: a training run's loss would be NaN
    rows = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
            rows += batch.num_rows
            for name in batch.schema.names:
                col = batch.column(name)
                ft = meta.features.get(name)
                if col.null_count and ft is not None and not ft.is_image:
                    nulls[name] = nulls.get(name, 0) + col.null_count
                bad = _non_finite(col) if name not in INDEX_COLUMNS else 0  # timestamps: per episode below
                if bad:
                    non_finite[name] = non_finite.get(name, 0) + bad
                if name in INDEX_COLUMNS and (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
                    kept.setdefault(name, []).append(col.to_numpy(zero_copy_only=False))
    except Exception as e:  # pyarrow raises several types for damaged pages
        problems.append(unreadable_parquet(path, e))
        return 0
    problems += [f"{path}: column '{name}' has {n} null value(s)" for name, n in nulls.items()]
    problems += [f"{path}: column '{name}' holds {n} NaN or infinite value(s)" for name, n in non_finite.items()]
    cols = {name: np.concatenate(parts) for name, parts in kept.items() if name not in nulls}
    if "episode_index" not in cols:
        return rows  # its problem is listed with the columns
    eps = meta.episodes
    ep = cols["episode_index"]
    order = np.argsort(ep, kind="stable")  # each episode's rows, in file order
    sorted_ep = ep[order]
    placed = set(eps.index[positions].tolist())
    stray = sorted(set(np.unique(ep).tolist()) - placed)
    if stray:
        problems.append(f"{path}: holds rows of {episode_list(stray)}, which the episode metadata does not put in "
                        "this file")
    for p in positions:
        e, n = int(eps.index[p]), int(eps.length[p])
        mine = order[np.searchsorted(sorted_ep, e, "left"):np.searchsorted(sorted_ep, e, "right")]
        where = f"{path}: episode {e}"
        if len(mine) != n:
            problems.append(f"{where} has {len(mine)} rows, the episode metadata says {n}")
            continue
        _sequence(cols, "frame_index", mine, np.arange(n), where, problems)
        _sequence(cols, "index", mine, eps.start[p] + np.arange(n), where, problems)
        if "timestamp" in cols:
            ts = cols["timestamp"][mine].astype(np.float64)
            if not np.isfinite(ts).all():
                problems.append(f"{where}: timestamp holds NaN or infinity")
            elif n > 1 and (np.diff(ts) <= 0).any():
                k = int(np.flatnonzero(np.diff(ts) <= 0)[0]) + 1
                problems.append(f"{where}: timestamp does not increase at frame {k} ({ts[k - 1]:.6g} -> {ts[k]:.6g})")
        if "task_index" in cols:
            task = cols["task_index"][mine]
            bad = np.flatnonzero((task < 0) | (task >= len(meta.tasks)) | (task != np.round(task)))
            if len(bad):
                problems.append(f"{where} frame {int(bad[0])}: task_index {task[bad[0]]} is out of range "
                                f"({len(meta.tasks)} tasks in the task metadata)")
    return rows


def _non_finite(col: pa.Array) -> int:
    while pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_large_list(col.type):
        col = col.flatten()
    if not pa.types.is_floating(col.type):
        return 0
    return len(col) - col.null_count - int(pc.sum(pc.is_finite(col)).as_py() or 0)


def _sequence(cols: dict, name: str, rows: np.ndarray, expected: np.ndarray, where: str, problems: list[str]) -> None:
    if name not in cols:
        return
    values = cols[name][rows]
    wrong = np.flatnonzero(values != expected)
    if len(wrong):
        k = int(wrong[0])
        problems.append(f"{where}: {name} is not {expected[0]}..{expected[-1]} in row order (frame {k} has "
                        f"{values[k]})")


def _unreferenced(meta: DatasetMeta, referenced: set[str]) -> list[str]:
    """Parquet files under the data directory (data_path up to its first placeholder) that no episode points to:
    episodes the metadata lost."""
    fixed = []
    for part in Path(meta.info["data_path"]).parts[:-1]:
        if "{" in part:
            break
        fixed.append(part)
    if not fixed or fixed[0] == "meta" or not (meta.root.joinpath(*fixed)).is_dir():
        return []
    on_disk = {p.relative_to(meta.root).as_posix() for p in meta.root.joinpath(*fixed).rglob("*.parquet")}
    return [f"{meta.root / rel}: no episode of the episode metadata points to this data file"
            for rel in sorted(on_disk - {Path(r).as_posix() for r in referenced})]


def _check_video(meta: DatasetMeta, key: str, path: Path, positions: list[int], tolerance_s: float) -> list[str]:
    if not path.is_file():
        return [f"{path}: video file of '{key}' not found"]
    eps = meta.episodes
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return [f"{path}: has no video stream"]
            stream = container.streams.video[0]
            frame = next(container.decode(stream), None)
            if frame is None:
                return [f"{path}: holds no video frame"]
            problems = []
            ft = meta.features[key]
            h, w = (ft.shape[0], ft.shape[1]) if ft.shape[-1] == ft.channels else (ft.shape[1], ft.shape[2])
            if (frame.height, frame.width) != (h, w):
                problems.append(f"{path}: frames are {frame.height}x{frame.width} (height x width), "
                                f"info.json features.{key}.shape says {h}x{w}")
            if stream.duration is not None:
                start = float((stream.start_time or 0) * stream.time_base)
                end = start + float(stream.duration * stream.time_base)
                last = {int(eps.index[p]): float(eps.video_start[key][p]) + (int(eps.length[p]) - 1) / meta.fps
                        for p in positions}
                late = {e: t for e, t in last.items() if t > end + tolerance_s}
                if late:
                    e = max(late, key=late.get)
                    problems.append(f"{path}: the video ends at {end:.4f}s, before the last frame of "
                                    f"{episode_list(sorted(late))} (at {late[e]:.4f}s"
                                    f"{f' in episode {e}' if len(late) > 1 else ''})")
            return problems
    except (OSError, av.error.FFmpegError) as e:
        return [f"{path}: cannot decode video ({one_line(e)})"]
