"""Rows of ``seq_len`` tokens from variable-length samples: packed (best-fit decreasing) or one sample per row.

A row holds ``tokens`` (``pad_id`` after the last sample), ``labels`` (IGNORE_INDEX on padding), ``position_ids``
(restarting at 0 for every sample) and ``segments`` (1..k for the k samples of the row, 0 on padding), which the
decoder's block-diagonal attention and the loss read. Packing is deterministic: the same samples give the same
rows, so it is done once and the loader reshuffles the rows every epoch.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from longboat.data.chat.supervision import Sample
from longboat.data.labels import IGNORE_INDEX


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of sample indices, each holding at most ``capacity`` tokens.

    Longest first (ties by index), each sample goes to the open bin it fills most tightly (ties: the first bin
    opened), else to a new bin. Open bins are kept by room left, one heap of bins per room, so finding the tightest
    fit costs a bisection over the distinct rooms (at most ``capacity``), not over every open bin.
    """
    if any(n > capacity or n <= 0 for n in lengths):
        raise ValueError(f"every length must be in 1..{capacity}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    rooms: list[int] = []  # the distinct rooms of open bins, sorted
    by_room: dict[int, list[int]] = {}  # room -> heap of the bins with that room
    for i in order:
        n = lengths[i]
        k = bisect.bisect_left(rooms, n)
        if k < len(rooms):
            room = rooms[k]
            b = heapq.heappop(by_room[room])
            if not by_room[room]:
                del rooms[k], by_room[room]
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        if room - n > 0:
            if room - n not in by_room:
                bisect.insort(rooms, room - n)
                by_room[room - n] = []
            heapq.heappush(by_room[room - n], b)
    return bins


class ChatRows(Dataset):
    """Rows of samples: ``rows[r]`` lists the samples laid out, in order, in row ``r``."""

    def __init__(self, samples: Sequence[Sample], rows: list[list[int]], seq_len: int, pad_id: int):
        self.seq_len, self.pad_id = seq_len, pad_id
        # Flat arrays: cheap to pickle into loader workers, no per-sample Python objects.
        lengths = np.array([len(s) for s in samples], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(lengths)])
        self.tokens = np.concatenate([s.tokens for s in samples]) if samples else np.zeros(0, np.int32)
        self.labels = np.concatenate([s.labels for s in samples]) if samples else np.zeros(0, np.int32)
        self.row_starts = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
        self.row_samples = np.array([i for r in rows for i in r], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.row_starts) - 1

    def __getitem__(self, r: int) -> dict[str, torch.Tensor]:
        tokens = np.full(self.seq_len, self.pad_id, dtype=np.int64)
        labels = np.full(self.seq_len, IGNORE_INDEX, dtype=np.int64)
        positions = np.zeros(self.seq_len, dtype=np.int64)
        segments = np.zeros(self.seq_len, dtype=np.int64)
        at = 0
        for k, i in enumerate(self.row_samples[self.row_starts[r]:self.row_starts[r + 1]], start=1):
            a, b = self.starts[i], self.starts[i + 1]
            n = b - a
            tokens[at:at + n] = self.tokens[a:b]
            labels[at:at + n] = self.labels[a:b]
            positions[at:at + n] = np.arange(n)
            segments[at:at + n] = k
            at += n
        return {"tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels),
                "position_ids": torch.from_numpy(positions), "segments": torch.from_numpy(segments)}

    @property
    def efficiency(self) -> float:
        """The fraction of row positions that hold tokens rather than padding."""
        return len(self.tokens) / max(len(self) * self.seq_len, 1)

    def fingerprint_arrays(self) -> Iterator[np.ndarray]:
        """What identifies the rows, in an order :class:`MappedRows` reproduces piece by piece."""
        yield from (self.tokens, self.labels, self.starts, self.row_starts, self.row_samples)


def pack(samples: Sequence[Sample], seq_len: int, pad_id: int) -> ChatRows:
    """Samples packed into as few rows as best-fit decreasing finds."""
    return ChatRows(samples, best_fit_decreasing([len(s) for s in samples], seq_len), seq_len, pad_id)


def pad(samples: Sequence[Sample], seq_len: int, pad_id: int) -> ChatRows:
    """One sample per row, padded to ``seq_len``."""
    if any(len(s) > seq_len for s in samples):
        raise ValueError(f"every sample must hold at most {seq_len} tokens")
    return ChatRows(samples, [[i] for i in range(len(samples))], seq_len, pad_id)


class MappedArrays:
    """A sample store: ``tokens``/``labels`` end to end, sample ``i`` at ``starts[i]:starts[i + 1]``.

    Memory-mapped arrays travel to loader workers as their file names (reopened there), not as copies.
    """

    def __init__(self, tokens: np.ndarray, labels: np.ndarray, starts: np.ndarray):
        self.tokens, self.labels, self.starts = tokens, labels, starts

    def __getstate__(self) -> dict:
        return {k: ((a.filename, a.dtype.str, a.shape, a.offset) if isinstance(a, np.memmap) else a)
                for k, a in vars(self).items()}

    def __setstate__(self, state: dict) -> None:
        for k, a in state.items():
            if isinstance(a, tuple):
                a = np.memmap(a[0], dtype=np.dtype(a[1]), mode="r", shape=a[2], offset=a[3])
            setattr(self, k, a)


class MappedRows(Dataset):
    """Rows like :class:`ChatRows`, of samples left in their stores (e.g. memory-mapped caches): the rows are laid
    out from the samples' lengths alone and a row's tokens are read only when it is built.

    Sample ``i`` of the rows is sample ``index[i]`` of store ``store[i]``; ``rows[r]`` lists the samples of row ``r``.
    """

    def __init__(self, stores: Sequence[MappedArrays], store: np.ndarray, index: np.ndarray,
                 rows_starts: np.ndarray, rows_samples: np.ndarray, seq_len: int, pad_id: int):
        self.stores, self.store, self.index = list(stores), store, index
        self.row_starts, self.row_samples = rows_starts, rows_samples
        self.seq_len, self.pad_id = seq_len, pad_id
        self.lengths = sample_lengths(self.stores, store, index)

    def __len__(self) -> int:
        return len(self.row_starts) - 1

    def __getitem__(self, r: int) -> dict[str, torch.Tensor]:
        tokens = np.full(self.seq_len, self.pad_id, dtype=np.int64)
        labels = np.full(self.seq_len, IGNORE_INDEX, dtype=np.int64)
        positions = np.zeros(self.seq_len, dtype=np.int64)
        segments = np.zeros(self.seq_len, dtype=np.int64)
        at = 0
        for k, i in enumerate(self.row_samples[self.row_starts[r]:self.row_starts[r + 1]], start=1):
            store = self.stores[self.store[i]]
            a, b = store.starts[self.index[i]], store.starts[self.index[i] + 1]
            n = b - a
            tokens[at:at + n] = store.tokens[a:b]
            labels[at:at + n] = store.labels[a:b]
            positions[at:at + n] = np.arange(n)
            segments[at:at + n] = k
            at += n
        return {"tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels),
                "position_ids": torch.from_numpy(positions), "segments": torch.from_numpy(segments)}

    @property
    def efficiency(self) -> float:
        return int(self.lengths.sum()) / max(len(self) * self.seq_len, 1)

    def fingerprint_arrays(self) -> Iterator[np.ndarray]:
        """The arrays :meth:`ChatRows.fingerprint_arrays` gives for the same samples, tokens and labels in pieces:
        runs of consecutive samples of one store are one slice of it."""
        n = len(self.store)
        breaks = np.flatnonzero((self.store[1:] != self.store[:-1]) | (self.index[1:] != self.index[:-1] + 1)) + 1
        runs = list(zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [n]]))) if n else []
        for name in ("tokens", "labels"):
            for a, b in runs:
                store = self.stores[self.store[a]]
                yield getattr(store, name)[store.starts[self.index[a]]:store.starts[self.index[b - 1] + 1]]
        yield np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        yield from (self.row_starts, self.row_samples)


def sample_lengths(stores: Sequence[MappedArrays], store: np.ndarray, index: np.ndarray) -> np.ndarray:
    lengths = np.zeros(len(store), dtype=np.int64)
    for k, s in enumerate(stores):
        mine = store == k
        starts = np.asarray(s.starts)
        lengths[mine] = starts[index[mine] + 1] - starts[index[mine]]
    return lengths


def mapped_rows(stores: Sequence[MappedArrays], store: np.ndarray, index: np.ndarray, seq_len: int, pad_id: int,
                packing: bool = True) -> MappedRows:
    """The samples packed (best-fit decreasing, as :func:`pack`) or one per row (as :func:`pad`)."""
    lengths = sample_lengths(stores, store, index)
    if packing:
        rows = best_fit_decreasing(lengths.tolist(), seq_len)
        row_starts = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        row_samples = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=len(lengths))
    else:
        if (lengths > seq_len).any():
            raise ValueError(f"every sample must hold at most {seq_len} tokens")
        row_starts, row_samples = np.arange(len(lengths) + 1, dtype=np.int64), np.arange(len(lengths), dtype=np.int64)
    return MappedRows(stores, store, index, row_starts, row_samples, seq_len, pad_id)
