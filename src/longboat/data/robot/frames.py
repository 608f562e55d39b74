"""Frame rows of the selected episodes, loaded once from parquet into numpy columns checked against info.json."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa

from longboat.data.robot.episodes import episode_list
from longboat.data.robot.errors import RobotDataError
from longboat.data.robot.features import Feature, column_problems
from longboat.data.robot.meta import DatasetMeta, read_frames


class FrameColumns:
    """Numeric features as numpy arrays [N, *shape] (scalars [N]); images as arrow arrays of PNG bytes; strings."""

    def __init__(self, meta: DatasetMeta, positions: np.ndarray):
        """``positions`` index ``meta.episodes``; their rows are read from each data file once, in episode order."""
        eps = meta.episodes
        wanted = eps.index[positions]
        by_file: dict[str, list[int]] = {}
        for p in positions:
            by_file.setdefault(eps.data_file[p], []).append(int(eps.index[p]))
        tables = []
        for rel in by_file:
            # v2.1 keeps one episode per file: no filter needed.
            table = read_frames(meta.root, rel, None if meta.version == "v2.1" else np.asarray(by_file[rel]))
            problems = column_problems(meta.features, table.schema, meta.root / rel)
            if problems:
                raise RobotDataError(problems[0])
            tables.append(table.select([k for k, f in meta.features.items() if not f.is_video]))
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        ep_col = table.column("episode_index").to_numpy()
        order = np.lexsort((table.column("frame_index").to_numpy(), ep_col))
        if not np.array_equal(order, np.arange(len(order))):
            table = table.take(order)
            ep_col = ep_col[order]
        # Every selected episode must be present with as many rows as its metadata says.
        counts = dict(zip(*np.unique(ep_col, return_counts=True)))
        for p, e in zip(positions, wanted):
            if counts.get(int(e), 0) != eps.length[p]:
                raise RobotDataError(f"{meta.root / eps.data_file[p]}: episode {e} has {counts.get(int(e), 0)} "
                                     f"rows, the episode metadata says {eps.length[p]}")
        self.num_rows = table.num_rows
        self.numeric: dict[str, np.ndarray] = {}
        self.images: dict[str, pa.Array] = {}
        self.strings: dict[str, list[str]] = {}
        for key, ft in meta.features.items():
            if ft.is_video:
                continue
            col = table.column(key).combine_chunks()
            if ft.is_image:
                self.images[key] = col
            elif ft.dtype == "string":
                self.strings[key] = col.to_pylist()
            else:
                if col.null_count:
                    raise RobotDataError(f"{meta.root}: column '{key}' has {col.null_count} null value(s) in the rows "
                                         f"of {episode_list(wanted)}")
                self.numeric[key] = _to_numpy(col, ft, meta.root)
        task = self.numeric["task_index"]
        bad = np.flatnonzero((task < 0) | (task >= len(meta.tasks)))
        if len(bad):
            row = int(bad[0])
            ep = int(ep_col[row])
            raise RobotDataError(f"{meta.root / eps.data_file[eps.position(ep)]}: episode {ep} frame "
                                 f"{int(self.numeric['frame_index'][row])}: task_index {int(task[row])} is out of "
                                 f"range ({len(meta.tasks)} tasks in the task metadata)")


def _to_numpy(col: pa.Array, ft: Feature, root: Path) -> np.ndarray:
    if ft.is_scalar and not pa.types.is_list(col.type) and not pa.types.is_fixed_size_list(col.type):
        return col.to_numpy(zero_copy_only=False).astype(ft.numpy_dtype, copy=False)
    flat = col
    while pa.types.is_list(flat.type) or pa.types.is_fixed_size_list(flat.type) or pa.types.is_large_list(flat.type):
        flat = flat.flatten()
    values = flat.to_numpy(zero_copy_only=False).astype(ft.numpy_dtype, copy=False)
    if len(values) != len(col) * math.prod(ft.shape):  # variable-length lists of another size
        raise RobotDataError(f"{root}: column '{ft.name}' holds {len(values)} values in {len(col)} rows, "
                             f"not {list(ft.shape)} per row as info.json says")
    return values.reshape(len(col), *ft.shape) if not ft.is_scalar else values.reshape(len(col))
