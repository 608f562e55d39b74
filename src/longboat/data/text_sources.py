"""Documents from text inputs: ``.jsonl`` (``.jsonl.gz``), ``.parquet`` and plain text files.

Reading is split in two so the costly half can run in worker processes: :func:`iter_batches` reads
raw batches in input order (cheap, one process), :func:`batch_texts` turns a batch into strings.
"""

from __future__ import annotations

import glob
import gzip
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from longboat.errors import LongboatError
from longboat.utils.json_files import parse_json

TXT_MODES = ("file", "paragraph", "line")
_MAX_BATCH_BYTES = 1 << 20  # also cut batches here: long documents still make many batches to share out
_PARAGRAPH_BREAK = re.compile(r"\n(?:[ \t\r]*\n)+")  # one or more blank (or whitespace-only) lines


class TextSourceError(LongboatError, ValueError):
    """Text inputs cannot be read as documents: a bad option, row, column or encoding."""


class TextInputNotFoundError(TextSourceError, FileNotFoundError):
    """An input path or glob names no readable text file."""


@dataclass
class Batch:
    """Consecutive documents of one file: raw jsonl lines (``kind="jsonl"``) or texts (``"text"``)."""

    kind: str
    path: str
    first_line: int  # 1-based line (jsonl) or row (parquet) of items[0]; 0 for whole files
    items: list


def expand_inputs(patterns: Sequence[str | os.PathLike]) -> list[Path]:
    """Files named by paths or glob patterns, in the given order (globs sorted), without repeats."""
    if not patterns:
        raise TextInputNotFoundError("no input files given (pass at least one path or glob)")
    files: list[Path] = []
    for pattern in map(str, patterns):
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise TextInputNotFoundError(f"{pattern}: no files match this pattern")
            files.extend(map(Path, matches))
        elif os.path.isdir(pattern):
            raise TextInputNotFoundError(f"{pattern}: is a directory; pass files or a glob such as {pattern}/*.jsonl")
        elif not os.path.isfile(pattern):
            raise TextInputNotFoundError(f"{pattern}: input file not found")
        else:
            files.append(Path(pattern))
    return list(dict.fromkeys(files))


def file_kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def iter_batches(
    paths: Sequence[Path], text_key: str = "text", txt_mode: str = "file", batch_size: int = 256
) -> Iterator[Batch]:
    """Raw batches of at most ``batch_size`` documents, file by file, in order."""
    if txt_mode not in TXT_MODES:
        raise TextSourceError(f"txt_mode {txt_mode!r} is not one of {', '.join(TXT_MODES)}")
    if batch_size < 1:
        raise TextSourceError(f"batch_size must be at least 1, got {batch_size}")
    return _batches(paths, text_key, txt_mode, batch_size)  # options checked now, files read lazily


def _batches(paths: Sequence[Path], text_key: str, txt_mode: str, batch_size: int) -> Iterator[Batch]:
    text_files: list[Path] = []
    for path in paths:
        kind = file_kind(path)
        if kind == "text" and txt_mode == "file":
            text_files.append(path)  # whole files are small units: group several per batch
            continue
        if text_files:
            yield from _whole_files(text_files, batch_size)
            text_files = []
        if kind == "jsonl":
            yield from _jsonl_batches(path, batch_size)
        elif kind == "parquet":
            yield from _parquet_batches(path, text_key, batch_size)
        else:
            yield from _split_text_batches(path, txt_mode, batch_size)
    yield from _whole_files(text_files, batch_size)


def batch_texts(batch: Batch, text_key: str = "text") -> list[str]:
    """The documents of a batch as strings (parses jsonl; blank lines are skipped)."""
    if batch.kind != "jsonl":
        return batch.items
    texts = []
    for i, line in enumerate(batch.items):
        if not line.strip():
            continue
        where = f"{batch.path}:{batch.first_line + i}"
        row = parse_json(line, str(batch.path), TextSourceError, line=batch.first_line + i)
        if not isinstance(row, dict):
            raise TextSourceError(f"{where}: expected a JSON object per line, got {type(row).__name__}")
        if text_key not in row:
            keys = ", ".join(map(repr, list(row)[:10]))
            raise TextSourceError(f"{where}: no key {text_key!r} in this row (keys: {keys}); set the text key")
        text = row[text_key]
        if not isinstance(text, str):
            raise TextSourceError(f"{where}: {text_key!r} is {type(text).__name__}, expected a string")
        texts.append(text)
    return texts


def iter_text_batches(
    paths: Sequence[Path], text_key: str = "text", txt_mode: str = "file", batch_size: int = 256
) -> Iterator[list[str]]:
    """Lists of document strings, in order (single-process convenience over the two halves)."""
    for batch in iter_batches(paths, text_key, txt_mode, batch_size):
        yield batch_texts(batch, text_key)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TextSourceError(f"{path}: not UTF-8 text ({e})") from None


def _whole_files(paths: list[Path], batch_size: int) -> Iterator[Batch]:
    items: list[str] = []
    size = 0
    for path in paths:
        text = _read_text(path)
        items.append(text)
        size += len(text)
        if len(items) >= batch_size or size >= _MAX_BATCH_BYTES:
            yield Batch("text", str(path), 0, items)
            items, size = [], 0
    if items:
        yield Batch("text", str(paths[-1]), 0, items)


def _split_text_batches(path: Path, txt_mode: str, batch_size: int) -> Iterator[Batch]:
    text = _read_text(path)
    if txt_mode == "line":
        docs = [line for line in text.splitlines() if line.strip()]
    else:
        docs = [p.strip("\n") for p in _PARAGRAPH_BREAK.split(text) if p.strip()]
    yield from _chunk(docs, lambda i, items: Batch("text", str(path), i + 1, items), batch_size)


def _jsonl_batches(path: Path, batch_size: int) -> Iterator[Batch]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as f:
        items: list[bytes] = []
        size, first = 0, 1
        for n, line in enumerate(f, start=1):
            items.append(line)
            size += len(line)
            if len(items) >= batch_size or size >= _MAX_BATCH_BYTES:
                yield Batch("jsonl", str(path), first, items)
                items, size, first = [], 0, n + 1
        if items:
            yield Batch("jsonl", str(path), first, items)


def _parquet_batches(path: Path, text_key: str, batch_size: int) -> Iterator[Batch]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise TextSourceError(f"{path}: cannot read as parquet: {e}") from None
    schema = pf.schema_arrow
    if text_key not in schema.names:
        raise TextSourceError(
            f"{path}: no column {text_key!r} (columns: {', '.join(schema.names)}); set the text key"
        )
    col_type = schema.field(text_key).type
    if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
        raise TextSourceError(f"{path}: column {text_key!r} is {col_type}, expected strings")
    row = 1
    for record_batch in pf.iter_batches(batch_size=batch_size, columns=[text_key]):
        texts = record_batch.column(0).to_pylist()
        if record_batch.column(0).null_count:
            bad = row + texts.index(None)
            raise TextSourceError(f"{path}: row {bad}: column {text_key!r} is null")
        yield from _chunk(texts, lambda i, items, r=row: Batch("text", str(path), r + i, items), batch_size)
        row += len(texts)


def _chunk(docs: list[str], make, batch_size: int) -> Iterator[Batch]:
    """Cut ``docs`` by count and bytes; ``make(start_index, items)`` builds each batch."""
    start, size = 0, 0
    for i, doc in enumerate(docs):
        size += len(doc)
        if i + 1 - start >= batch_size or size >= _MAX_BATCH_BYTES:
            yield make(start, docs[start : i + 1])
            start, size = i + 1, 0
    if start < len(docs):
        yield make(start, docs[start:])
