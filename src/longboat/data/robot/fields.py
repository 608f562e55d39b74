"""Typed reads of metadata values (JSON files, parquet columns): each wrong value ends in one ``RobotDataError``
that names the file, the key or row, and what was expected, so no bad value reaches the reader as a traceback."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path, PurePosixPath
from string import Formatter

import numpy as np
import pyarrow as pa

from longboat.data.robot.errors import RobotDataError


def show(value: object, limit: int = 60) -> str:
    """``repr`` cut short: a wrong value may be a huge list."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(e: BaseException) -> str:
    """An exception's message on one line: pyarrow's and FFmpeg's may span several."""
    return " ".join(str(e).split())


def unreadable_parquet(path: Path, e: BaseException) -> str:
    return f"{path}: not a readable parquet file ({type(e).__name__}: {one_line(e)})"


def read_text(path: Path) -> str:
    if not path.is_file():
        raise RobotDataError(f"{path}: file not found")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RobotDataError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RobotDataError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def parse_json(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RobotDataError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        raise RobotDataError(f"{where}: not valid JSON (nested too deeply)") from None


def load_json(path: Path) -> object:
    return parse_json(read_text(path), str(path))


def integer(value: object, where: str, minimum: int | None = None) -> int:
    """A whole number (not a bool, not a float), at least ``minimum`` when given."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise RobotDataError(f"{where}: expected an integer, got {show(value)}")
    if minimum is not None and value < minimum:
        raise RobotDataError(f"{where}: expected an integer >= {minimum}, got {value}")
    if not -(2**63) <= value < 2**63:
        raise RobotDataError(f"{where}: {show(value)} does not fit in 64 bits")
    return int(value)


def positive_number(value: object, where: str) -> float | int:
    """A finite number > 0: NaN passes ``value <= 0`` and would pad every window."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise RobotDataError(f"{where}: expected a finite positive number, got {show(value)}")
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        finite = False
    if not finite or value <= 0:
        raise RobotDataError(f"{where}: expected a finite positive number, got {show(value)}")
    return value


def string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise RobotDataError(f"{where}: expected a string, got {show(value)}")
    return value


def string_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RobotDataError(f"{where}: expected a list of strings, got {show(value)}")
    return value


_INT_SPEC = re.compile(r"0?\d{0,2}d?")  # LeRobot writes {chunk_index:03d}, {episode_index:06d}


def path_template(value: object, where: str, placeholders: tuple[str, ...]) -> str:
    """A relative path inside the dataset with only the layout's ``placeholders`` (``video_key`` a string, the rest
    integers with a small zero-padded width)."""
    expected = ", ".join("{" + p + "}" for p in placeholders)
    if not isinstance(value, str) or not value:
        raise RobotDataError(f"{where}: expected a path template with {expected}, got {show(value)}")
    try:
        parts = list(Formatter().parse(value))
    except ValueError as e:
        raise RobotDataError(f"{where}: {show(value)} is not a valid path template ({e})") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in placeholders:
            raise RobotDataError(f"{where}: unknown placeholder {{{name}}} in {show(value)} (expected {expected})")
        if conversion or (spec if name == "video_key" else not _INT_SPEC.fullmatch(spec or "")):
            raise RobotDataError(f"{where}: placeholder {{{name}}} in {show(value)} has an unsupported format "
                                 f"'{('!' + conversion) if conversion else ':' + spec}'")
    sample = value.format(**{p: "key" if p == "video_key" else 0 for p in placeholders})
    rel = PurePosixPath(sample)
    if rel.is_absolute() or ".." in rel.parts:
        raise RobotDataError(f"{where}: {show(value)} must be a path inside the dataset directory")
    return value


def numeric_array(value: object, where: str) -> np.ndarray:
    """A number or a rectangular nesting of lists of numbers, all finite."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError, RecursionError):
        arr = None
    if arr is None or arr.dtype.kind not in "iuf":
        raise RobotDataError(f"{where}: expected a number or a (nested) list of numbers, got {show(value)}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise RobotDataError(f"{where}: holds NaN or infinity")
    return arr


def column_kind(table: pa.Table, name: str, path: Path) -> str:
    """'int', 'float', 'strings' (a list of strings) or 'string' for a column of a metadata table; a column with
    a null value, or of any other type, is refused."""
    col = table.column(name)
    t = col.type
    if pa.types.is_integer(t):
        kind = "int"
    elif pa.types.is_floating(t):
        kind = "float"
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        kind = "string"
    elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and (
            pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type)):
        kind = "strings"
    else:
        kind = str(t)
    if col.null_count:
        row = next(i for i, v in enumerate(col.is_null().to_pylist()) if v)
        raise RobotDataError(f"{path}: row {row}: column '{name}' is null")
    return kind


def expect_column(table: pa.Table, name: str, path: Path, kinds: tuple[str, ...]) -> list:
    """The values of a column whose kind is one of ``kinds``."""
    if name not in table.column_names:
        raise RobotDataError(f"{path}: missing column '{name}'")
    kind = column_kind(table, name, path)
    if kind not in kinds:
        names = {"int": "integers", "float": "numbers", "string": "strings", "strings": "lists of strings"}
        raise RobotDataError(f"{path}: column '{name}' holds {kind if kind not in names else names[kind]}, expected "
                             + " or ".join(names[k] for k in kinds))
    return table.column(name).to_pylist()
