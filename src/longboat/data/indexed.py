"""Megatron indexed token files: ``name.bin`` (tokens) + ``name.idx`` (index), memory-mapped.

The layout is megatron-core's ``IndexedDataset`` (version 1), so files move freely between the two.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Iterable

import numpy as np

from longboat.errors import LongboatError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document count

DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_CODE_OF = {np.dtype(t): c for c, t in DTYPE_CODES.items()}


class IndexedDataError(LongboatError, ValueError):
    """A ``.bin``/``.idx`` pair is missing, truncated or not in Megatron's format."""


def dtype_for_vocab(vocab_size: int) -> type[np.generic]:
    """The token dtype Megatron's writers pick: uint16 below 65500 ids, int32 above."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def index_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{prefix}.idx")


def data_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{prefix}.bin")


def strip_suffix(path: str | os.PathLike) -> str:
    """Accept ``name``, ``name.bin`` or ``name.idx`` and return the prefix ``name``."""
    s = str(path)
    return s[:-4] if s.endswith((".bin", ".idx")) else s


class IndexedDataset:
    """Read-only view of a Megatron token file pair.

    ``ds[i]`` is sequence ``i`` as a numpy array; ``ds.get(i, offset, length)`` a slice of it without
    copying. ``document_indices[d]:document_indices[d + 1]`` are the sequences of document ``d``.
    """

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = strip_suffix(prefix)
        idx, bin_ = index_path(self.prefix), data_path(self.prefix)
        for p in (idx, bin_):
            if not p.is_file():
                raise IndexedDataError(f"{p}: no such file (a token dataset is a NAME.bin + NAME.idx pair)")
        self._idx = np.memmap(idx, mode="r", dtype=np.uint8)
        if self._idx.size < _HEADER.size:
            raise IndexedDataError(f"{idx}: {self._idx.size} bytes is shorter than the {_HEADER.size}-byte header")
        magic, version, code, n_seq, n_doc = _HEADER.unpack_from(self._idx, 0)
        if magic != MAGIC:
            raise IndexedDataError(f"{idx}: not a Megatron index (magic {magic!r}, expected {MAGIC!r})")
        if version != VERSION:
            raise IndexedDataError(f"{idx}: index version {version} is not supported (expected {VERSION})")
        if code not in DTYPE_CODES:
            raise IndexedDataError(f"{idx}: unknown dtype code {code} (expected one of {sorted(DTYPE_CODES)})")
        self.dtype = np.dtype(DTYPE_CODES[code])
        expected = _HEADER.size + n_seq * (4 + 8) + n_doc * 8
        if self._idx.size != expected:
            raise IndexedDataError(
                f"{idx}: {self._idx.size} bytes, but a header for {n_seq} sequences and {n_doc} document "
                f"entries needs exactly {expected} (truncated or corrupt)"
            )
        off = _HEADER.size
        self.sequence_lengths = np.frombuffer(self._idx, np.int32, n_seq, off)
        off += n_seq * 4
        self.sequence_pointers = np.frombuffer(self._idx, np.int64, n_seq, off)
        off += n_seq * 8
        self.document_indices = np.frombuffer(self._idx, np.int64, n_doc, off)
        if n_doc == 0 or self.document_indices[0] != 0 or self.document_indices[-1] != n_seq:
            raise IndexedDataError(f"{idx}: document index must start at 0 and end at {n_seq} sequences")

        bin_size = bin_.stat().st_size
        n_tokens = int(self.sequence_lengths.sum(dtype=np.int64))
        if bin_size != n_tokens * self.dtype.itemsize:
            raise IndexedDataError(
                f"{bin_}: {bin_size} bytes, but {idx} describes {n_tokens} {self.dtype.name} tokens "
                f"({n_tokens * self.dtype.itemsize} bytes); the pair does not match"
            )
        # np.memmap refuses empty files; an empty dataset still has a valid (empty) token array.
        self._bin = np.memmap(bin_, mode="r", dtype=self.dtype) if bin_size else np.empty(0, self.dtype)
        self.num_tokens = n_tokens

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of sequence ``i`` (a view into the memory map)."""
        start = int(self.sequence_pointers[i]) // self.dtype.itemsize + offset
        n = int(self.sequence_lengths[i]) - offset if length is None else length
        return self._bin[start : start + n]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.get(i)


class IndexedDatasetWriter:
    """Writes a ``.bin``/``.idx`` pair. Use as a context manager; files appear only when complete.

    ``files``: the ``.bin`` and ``.idx`` to write instead, as they are, for a caller that stages them itself
    (:func:`longboat.utils.outputs.staged_files`) and renames them into place.
    """

    def __init__(self, prefix: str | os.PathLike, dtype: type[np.generic] | np.dtype = np.uint16,
                 files: tuple[str | os.PathLike, str | os.PathLike] | None = None):
        self.prefix = strip_suffix(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _CODE_OF:
            raise ValueError(f"dtype {self.dtype} cannot be stored in a Megatron index")
        self._files = None if files is None else (Path(files[0]), Path(files[1]))
        if self._files is None:
            Path(self.prefix).parent.mkdir(parents=True, exist_ok=True)
        self._tmp_bin = self._files[0] if self._files else Path(f"{self.prefix}.bin.tmp")
        self._bin = open(self._tmp_bin, "wb")
        self._lengths: list[int] = []
        self._doc_indices: list[int] = [0]

    def add_sequence(self, tokens: Iterable[int] | np.ndarray) -> None:
        arr = np.asarray(tokens, dtype=self.dtype)
        self._bin.write(arr.tobytes(order="C"))
        self._lengths.append(arr.size)

    def end_document(self) -> None:
        self._doc_indices.append(len(self._lengths))

    def add_document(self, tokens: Iterable[int] | np.ndarray) -> None:
        """One document of one sequence: the common case."""
        self.add_sequence(tokens)
        self.end_document()

    def add_index(self, other_prefix: str | os.PathLike) -> None:
        """Append every document of another token file pair (same dtype) without re-tokenizing."""
        other = IndexedDataset(other_prefix)
        if other.dtype != self.dtype:
            raise IndexedDataError(f"{other.prefix}: dtype {other.dtype} does not match {self.dtype}")
        base = len(self._lengths)
        self._lengths.extend(other.sequence_lengths.tolist())
        self._doc_indices.extend((other.document_indices[1:] + base).tolist())
        with open(data_path(other.prefix), "rb") as f:
            while chunk := f.read(1 << 24):
                self._bin.write(chunk)

    def close(self) -> None:
        self._bin.close()
        lengths = np.asarray(self._lengths, dtype=np.int32)
        pointers = np.zeros(len(lengths), dtype=np.int64)
        if len(lengths) > 1:
            np.cumsum(lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        docs = np.asarray(self._doc_indices, dtype=np.int64)
        tmp_idx = self._files[1] if self._files else Path(f"{self.prefix}.idx.tmp")
        with open(tmp_idx, "wb") as f:
            f.write(_HEADER.pack(MAGIC, VERSION, _CODE_OF[self.dtype], len(lengths), len(docs)))
            f.write(lengths.tobytes())
            f.write(pointers.tobytes())
            f.write(docs.tobytes())
        if self._files:
            return
        os.replace(self._tmp_bin, data_path(self.prefix))
        os.replace(tmp_idx, index_path(self.prefix))

    def abort(self) -> None:
        self._bin.close()
        if self._files is None:
            self._tmp_bin.unlink(missing_ok=True)

    def __enter__(self) -> "IndexedDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.abort() if exc_type else self.close()
