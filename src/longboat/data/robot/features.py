"""Feature descriptions of ``meta/info.json``: dtype, shape, names, and how each is stored in parquet."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from longboat.data.robot.errors import RobotDataError
from longboat.data.robot.fields import show

VISUAL_DTYPES = ("video", "image")
NUMERIC_KINDS = "biuf"  # numpy kinds of bool, signed, unsigned and float dtypes
# Columns every frame row has (``meta/info.json`` lists them too); LeRobot stores them as scalars.
DEFAULT_FEATURES: dict[str, dict] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


@dataclass(frozen=True)
class Feature:
    """One entry of ``features``; ``info`` holds a video's codec, size and pixel format."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    names: object = None
    info: dict = field(default_factory=dict)

    @property
    def is_video(self) -> bool:
        return self.dtype == "video"

    @property
    def is_image(self) -> bool:
        return self.dtype == "image"

    @property
    def is_visual(self) -> bool:
        return self.dtype in VISUAL_DTYPES

    @property
    def is_scalar(self) -> bool:
        """Shape [1] features are parquet scalars (LeRobot's convention), read back as 0-d tensors."""
        return self.shape == (1,)

    @property
    def channels(self) -> int:
        """A camera's channel count: shape [H, W, C], or [C, H, W] when the last size is not 1 or 3."""
        return self.shape[-1] if self.shape[-1] in (1, 3) else self.shape[0]

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def arrow_type(self) -> pa.DataType:
        """The parquet column type LeRobot writes: a scalar, or nested fixed-size lists for vectors and arrays."""
        if self.is_image:
            return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        t = pa.from_numpy_dtype(self.numpy_dtype)
        if self.is_scalar:
            return t
        for n in reversed(self.shape):
            t = pa.list_(pa.field("element", t), n)  # the child name HF datasets (and so LeRobot) writes
        return t

    def to_json(self) -> dict:
        out: dict = {"dtype": self.dtype, "shape": list(self.shape), "names": self.names}
        if self.info:
            out["info"] = self.info
        return out


def parse_features(raw: object, source: str) -> dict[str, Feature]:
    """Validate ``features`` of an info.json (``source`` names the file in errors)."""
    if not isinstance(raw, dict) or not raw:
        raise RobotDataError(f"{source}: 'features' must be a non-empty mapping of name -> {{dtype, shape}}")
    out = {}
    for name, ft in raw.items():
        where = f"{source}: features.{name}"
        if not isinstance(ft, dict) or "dtype" not in ft or "shape" not in ft:
            raise RobotDataError(f"{where}: expected a mapping with 'dtype' and 'shape', got {show(ft)}")
        dtype, shape = ft["dtype"], ft["shape"]
        if not isinstance(shape, (list, tuple)) or not shape or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise RobotDataError(f"{where}.shape: expected a list of positive integers, got {show(shape)}")
        if not isinstance(dtype, str):
            raise RobotDataError(f"{where}.dtype: expected a dtype name, got {show(dtype)}")
        if dtype not in (*VISUAL_DTYPES, "string"):
            try:
                kind = np.dtype(dtype).kind
            except Exception:  # numpy raises several types for names it cannot parse
                kind = None
            if kind is None or kind not in NUMERIC_KINDS:
                raise RobotDataError(f"{where}.dtype: unknown dtype {dtype!r} (expected a numeric or bool dtype, "
                                     f"{', '.join(VISUAL_DTYPES)} or string)")
        if dtype in VISUAL_DTYPES and len(shape) != 3:
            raise RobotDataError(f"{where}.shape: a {dtype} feature has shape [height, width, channels], got {shape}")
        info = ft.get("info")
        if info is not None and not isinstance(info, dict):
            raise RobotDataError(f"{where}.info: expected a mapping, got {show(info)}")
        out[name] = Feature(name, dtype, tuple(shape), ft.get("names"), dict(info or {}))
    return out


def check_default_features(features: dict[str, Feature], source: str) -> None:
    """Every frame row has timestamp, frame_index, episode_index, index and task_index: the reader needs them."""
    for name, default in DEFAULT_FEATURES.items():
        ft = features.get(name)
        if ft is None:
            raise RobotDataError(f"{source}: features: '{name}' is missing (every LeRobot dataset has "
                                 f"{', '.join(DEFAULT_FEATURES)})")
        kinds = "f" if name == "timestamp" else "iu"
        if ft.shape != (1,) or ft.dtype in (*VISUAL_DTYPES, "string") or np.dtype(ft.dtype).kind not in kinds:
            raise RobotDataError(f"{source}: features.{name}: expected {'a float' if kinds == 'f' else 'an integer'} "
                                 f"dtype of shape [1] (LeRobot: {default['dtype']} [1]), got {ft.dtype} "
                                 f"{list(ft.shape)}")


def column_problems(features: dict[str, Feature], schema: pa.Schema, path) -> list[str]:
    """A data file's parquet columns against the info.json features (less videos): present, with their shapes."""
    problems = []
    names = set(schema.names)
    for key, ft in features.items():
        if ft.is_video:
            if key in names:
                problems.append(f"{path}: column '{key}' is a video feature in info.json but stored in parquet")
            continue
        if key not in names:
            problems.append(f"{path}: column '{key}' of info.json features is missing")
            continue
        t = schema.field(key).type
        if ft.is_image:
            if not pa.types.is_struct(t) or t.get_field_index("bytes") < 0:
                problems.append(f"{path}: column '{key}' is an image feature but stored as {t}, "
                                "expected struct<bytes, path>")
            continue
        if ft.dtype == "string":
            if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                problems.append(f"{path}: column '{key}' holds {t}, info.json says string")
            continue
        dims = []
        while pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            dims.append(t.list_size if pa.types.is_fixed_size_list(t) else None)
            t = t.value_type
        expected = [] if ft.is_scalar and not dims else list(ft.shape)
        if len(dims) != len(expected) or any(d is not None and d != e for d, e in zip(dims, expected)):
            problems.append(f"{path}: column '{key}' has shape {dims or 'scalar'}, info.json says {list(ft.shape)}")
        elif not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            problems.append(f"{path}: column '{key}' holds {t}, info.json says {ft.dtype}")
    extra = names - set(features)
    if extra:
        problems.append(f"{path}: columns {sorted(extra)} are not in info.json features")
    return problems
