"""Images stored in parquet (LeRobot's ``{bytes, path}`` struct of PNG bytes) decoded with Pillow."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image

from longboat.data.robot.errors import RobotDataError
from longboat.data.robot.fields import one_line


def decode_image(column: pa.Array, row: int, root: Path, key: str) -> np.ndarray:
    """uint8 RGB [H, W, 3] of one row; a row without bytes names a file relative to the dataset root."""
    value = column[row].as_py()
    data, rel = (value or {}).get("bytes"), (value or {}).get("path")
    try:
        if data is not None:
            img = Image.open(io.BytesIO(data))
        elif rel:
            img = Image.open(root / rel)
        else:
            raise RobotDataError(f"{root}: feature '{key}' row {row} holds no image")
        return np.asarray(img.convert("RGB"))
    except (OSError, ValueError) as e:
        raise RobotDataError(f"{root}: feature '{key}' row {row}: cannot decode image ({one_line(e)})") from None
