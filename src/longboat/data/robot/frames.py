"""Frame rows of the selected episodes, loaded once from parquet into numpy columns checked against info.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from longboat.data.robot.errors import RobotDataError
from longboat.data.robot.features import Feature
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
            _check_columns(meta, table, meta.root / rel)
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
                self.numeric[key] = _to_numpy(col, ft)


def _to_numpy(col: pa.Array, ft: Feature) -> np.ndarray:
    if ft.is_scalar and not pa.types.is_list(col.type) and not pa.types.is_fixed_size_list(col.type):
        return col.to_numpy(zero_copy_only=False).astype(ft.numpy_dtype, copy=False)
    flat = col
    while pa.types.is_list(flat.type) or pa.types.is_fixed_size_list(flat.type) or pa.types.is_large_list(flat.type):
        flat = flat.flatten()
    values = flat.to_numpy(zero_copy_only=False).astype(ft.numpy_dtype, copy=False)
    return values.reshape(len(col), *ft.shape) if not ft.is_scalar else values.reshape(len(col))


def _check_columns(meta: DatasetMeta, table: pa.Table, path: Path) -> None:
    """Parquet columns must be the info.json features (less videos), with their shapes."""
    names = set(table.column_names)
    for key, ft in meta.features.items():
        if ft.is_video:
            if key in names:
                raise RobotDataError(f"{path}: column '{key}' is a video feature in info.json but stored in parquet")
            continue
        if key not in names:
            raise RobotDataError(f"{path}: column '{key}' of info.json features is missing")
        t = table.schema.field(key).type
        if ft.is_image:
            if not pa.types.is_struct(t) or t.get_field_index("bytes") < 0:
                raise RobotDataError(f"{path}: column '{key}' is an image feature but stored as {t}, "
                                     "expected struct<bytes, path>")
            continue
        if ft.dtype == "string":
            continue
        dims = []
        while pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            dims.append(t.list_size if pa.types.is_fixed_size_list(t) else None)
            t = t.value_type
        expected = [] if ft.is_scalar and not dims else list(ft.shape)
        if len(dims) != len(expected) or any(d is not None and d != e for d, e in zip(dims, expected)):
            raise RobotDataError(f"{path}: column '{key}' has shape {dims or 'scalar'}, "
                                 f"info.json says {list(ft.shape)}")
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            raise RobotDataError(f"{path}: column '{key}' holds {t}, info.json says {ft.dtype}")
    extra = names - set(meta.features)
    if extra:
        raise RobotDataError(f"{path}: columns {sorted(extra)} are not in info.json features")
