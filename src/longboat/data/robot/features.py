"""Feature descriptions of ``meta/info.json``: dtype, shape, names, and how each is stored in parquet."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from longboat.data.robot.errors import RobotDataError

VISUAL_DTYPES = ("video", "image")
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
            raise RobotDataError(f"{where}: expected a mapping with 'dtype' and 'shape', got {ft!r}")
        dtype, shape = ft["dtype"], ft["shape"]
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d > 0 for d in shape):
            raise RobotDataError(f"{where}.shape: expected a list of positive integers, got {shape!r}")
        if dtype not in (*VISUAL_DTYPES, "string"):
            try:
                np.dtype(dtype)
            except TypeError:
                raise RobotDataError(f"{where}.dtype: unknown dtype {dtype!r}") from None
        if dtype in VISUAL_DTYPES and len(shape) != 3:
            raise RobotDataError(f"{where}.shape: a {dtype} feature has shape [height, width, channels], got {shape}")
        out[name] = Feature(name, dtype, tuple(shape), ft.get("names"), dict(ft.get("info") or {}))
    return out
