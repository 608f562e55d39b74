"""Train/valid/test GPT datasets from one token file or a weighted blend, as megatron-core 0.16.1 builds them.

Mirrors ``BlendedMegatronDatasetBuilder`` with one ``blend`` and a ``split`` string: each file is split by
documents with the normalised split weights; a single file gives plain ``GPTDataset`` splits; a blend sizes
each file's split to ``ceil(ceil(n * w) * (1 + surplus))`` samples and interleaves them with a
``BlendedDataset`` that always draws from the file furthest behind its share.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from longboat.config.base import ConfigError
from longboat.data.gpt import GPTDataset, GPTDatasetConfig, GPTDatasetError
from longboat.data.index_cache import cached_arrays
from longboat.data.indexed import IndexedDataset
from longboat.data.split import SPLIT_NAMES, normalize, parse_split

_MIN_GUESS, _MAX_GUESS = 1 << 10, 1 << 16  # steps guessed at once


class BlendOversampleError(GPTDatasetError):
    """The blend draws more samples from a file than were built for it."""


def surplus_size(num_samples: int, weight: float, surplus: float) -> int:
    """Samples to build from one file of a blend: ``ceil(ceil(n * w) * (1 + surplus))``."""
    return int(math.ceil(math.ceil(num_samples * weight) * (1 + surplus)))


# ---------------------------------------------------------------------------------------------------------
# Blending order


def blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index int16, dataset_sample_index int64) of Megatron's ``build_blending_indices``.

    Step ``i`` draws from the dataset with the largest deficit ``w_d * max(i, 1) - drawn_d`` (first on ties).
    The rule is sequential; runs of steps are guessed in bulk (each dataset's draws at its ideal times
    ``k / w_d``, right for long runs with two datasets of generic weights) and verified against the rule
    with numpy. Where guesses keep failing early (three or more datasets, or weights whose deficits tie in
    floating point, e.g. 0.7/0.3), the rule is stepped exactly in plain Python.
    """
    w = np.asarray(weights, dtype=np.float64)
    n_datasets = len(w)
    dataset_index = np.empty(size, dtype=np.int16)
    counts = np.zeros(n_datasets, dtype=np.int64)
    longest = max(_MIN_GUESS, _MAX_GUESS * 8 // max(n_datasets, 8))
    ahead, exact = _MIN_GUESS, _MIN_GUESS
    i = 0
    while i < size:
        n = min(ahead, size - i)
        guess = _ideal_order(w, counts, n)
        drawn = _drawn_before(guess, counts, n_datasets)
        deficit = w[None, :] * np.maximum(np.arange(i, i + n), 1)[:, None].astype(np.float64) - drawn
        truth = np.argmax(deficit, axis=1)
        wrong = np.flatnonzero(truth != guess)
        good = n if wrong.size == 0 else int(wrong[0]) + 1  # the rule's own pick at the first miss is right
        dataset_index[i : i + good] = truth[:good]
        counts += np.bincount(truth[:good], minlength=n_datasets)
        i += good
        if good == n:
            ahead, exact = min(2 * ahead, longest), _MIN_GUESS
        elif good < n // 8 and i < size:
            # Guessing does not pay here: step exactly for a while, longer each time it keeps failing.
            i = _step_exactly(w.tolist(), counts, dataset_index, i, min(size, i + exact))
            ahead, exact = _MIN_GUESS, min(2 * exact, longest)
    return dataset_index, _rank_within(dataset_index, n_datasets)


def _ideal_order(w: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    """The next ``n`` draws if dataset ``d``'s ``k``-th draw happened at time ``k / w_d`` (ties: lower ``d``)."""
    times, ids = [], []
    for d, (weight, done) in enumerate(zip(w.tolist(), counts.tolist())):
        k = np.arange(done, done + int(math.ceil(n * weight)) + 2, dtype=np.float64)
        times.append(k / weight)
        ids.append(np.full(len(k), d, dtype=np.int64))
    order = np.argsort(np.concatenate(times), kind="stable")
    return np.concatenate(ids)[order][:n]


def _drawn_before(picks: np.ndarray, counts: np.ndarray, n_datasets: int) -> np.ndarray:
    """``[n, D]``: how many draws each dataset has before each step, starting from ``counts``."""
    onehot = picks[:, None] == np.arange(n_datasets)[None, :]
    return counts[None, :] + np.cumsum(onehot, axis=0) - onehot


def _step_exactly(w: list[float], counts: np.ndarray, out: np.ndarray, start: int, stop: int) -> int:
    """Apply the largest-deficit rule one step at a time for steps ``[start, stop)``; returns ``stop``."""
    drawn = counts.tolist()
    picks = []
    for i in range(start, stop):
        s = float(max(i, 1))
        best, best_deficit = 0, w[0] * s - drawn[0]
        for d in range(1, len(w)):
            deficit = w[d] * s - drawn[d]
            if deficit > best_deficit:
                best, best_deficit = d, deficit
        drawn[best] += 1
        picks.append(best)
    out[start:stop] = picks
    counts[:] = drawn
    return stop


def _rank_within(dataset_index: np.ndarray, n_datasets: int) -> np.ndarray:
    """For each step, how many earlier steps drew from the same dataset."""
    order = np.argsort(dataset_index, kind="stable")
    first = np.concatenate(([0], np.cumsum(np.bincount(dataset_index, minlength=n_datasets))[:-1]))
    ranks = np.empty(len(dataset_index), dtype=np.int64)
    ranks[order] = np.arange(len(dataset_index), dtype=np.int64) - first[dataset_index[order]]
    return ranks


class BlendedDataset(torch.utils.data.Dataset):
    """``size`` samples interleaved from ``datasets`` in proportion to ``weights`` (normalised).

    Items are the chosen dataset's items plus ``dataset_id``. The order is deterministic: Megatron's rule
    uses no randomness.
    """

    def __init__(
        self,
        datasets: Sequence[torch.utils.data.Dataset],
        weights: Sequence[float],
        size: int,
        *,
        cache_dir: str | None = None,
    ):
        if not datasets or len(datasets) != len(weights):
            raise ValueError(f"need one weight per dataset, got {len(datasets)} datasets and {len(weights)} weights")
        if len(datasets) >= 32767:
            raise ValueError(f"at most 32766 datasets can be blended (int16 index), got {len(datasets)}")
        if any(not w > 0 for w in weights):
            raise ValueError(f"blend weights must be positive, got {list(weights)}")
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self.datasets, self.weights, self.size = list(datasets), normalize(weights), int(size)
        keys = [getattr(ds, "cache_key", None) for ds in self.datasets]
        description = {"format": 1, "datasets": keys, "weights": self.weights, "size": self.size}
        arrays, self.from_cache = cached_arrays(
            cache_dir if all(keys) else None, "blend", description, self._build,
            {"paths": [str(getattr(ds, "path", "?")) for ds in self.datasets]},
        )
        self.dataset_index = arrays["dataset_index"]
        self.dataset_sample_index = arrays["dataset_sample_index"]

    def _build(self) -> dict[str, np.ndarray]:
        dataset_index, dataset_sample_index = blending_indices(self.weights, self.size)
        drawn = np.bincount(dataset_index, minlength=len(self.datasets))
        for d, (n, ds) in enumerate(zip(drawn.tolist(), self.datasets)):
            if n > len(ds):
                raise BlendOversampleError(
                    f"the blend draws {n} samples from dataset {d} ({getattr(ds, 'path', ds)}), which has only "
                    f"{len(ds)}; raise blend_surplus (Megatron: mid_level_dataset_surplus)"
                )
        return {"dataset_index": dataset_index, "dataset_sample_index": dataset_sample_index}

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for a blend of {len(self)} samples")
        d = int(self.dataset_index[idx])
        return {**self.datasets[d][int(self.dataset_sample_index[idx])], "dataset_id": torch.tensor(d)}


# ---------------------------------------------------------------------------------------------------------
# Builder


def build_gpt_datasets(
    paths_and_weights: Sequence[tuple[str, float]],
    split: str | None,
    sizes: Sequence[int | None],
    config: GPTDatasetConfig,
) -> tuple[GPTDataset | BlendedDataset | None, ...]:
    """(train, valid, test) from token files, as Megatron's ``BlendedMegatronDatasetBuilder`` builds them.

    ``split`` (``None``: ``config.split``) cuts every file by documents. A single file gives ``GPTDataset``
    splits (its weight is ignored; a size of ``None`` means one epoch). Several files give, per split,
    one ``GPTDataset`` per file sized ``ceil(ceil(n * w) * (1 + blend_surplus))`` and a ``BlendedDataset``
    of ``sum(ceil(n * w))`` samples. A split is ``None`` when its size is 0 or its split weight is 0.
    """
    split = config.split if split is None else split
    if not paths_and_weights:
        raise ConfigError("no token files given to build GPT datasets from")
    if len(sizes) != len(SPLIT_NAMES):
        raise ConfigError(f"sizes must give {len(SPLIT_NAMES)} sample counts (train, valid, test), got {list(sizes)}")
    indexed = [IndexedDataset(path) for path, _ in paths_and_weights]

    if len(indexed) == 1:
        ranges = parse_split(split, len(indexed[0]))
        return tuple(
            None if ranges[i] is None or n == 0 else GPTDataset(indexed[0], ranges[i], n, config, name)
            for i, (name, n) in enumerate(zip(SPLIT_NAMES, sizes))
        )

    raw = [float(w) for _, w in paths_and_weights]
    if any(not w > 0 for w in raw):
        raise ConfigError(f"blend weights must be positive, got {raw} for {[p for p, _ in paths_and_weights]}")
    weights = normalize(raw)
    ranges = [parse_split(split, len(ds)) for ds in indexed]
    out: list[BlendedDataset | None] = []
    for i, (name, n) in enumerate(zip(SPLIT_NAMES, sizes)):
        if ranges[0][i] is None or n == 0:
            out.append(None)
            continue
        if n is None:
            raise ConfigError(f"a weighted blend needs a sample count for the {name} split, got None")
        parts = [
            GPTDataset(ds, r[i], surplus_size(n, w, config.blend_surplus), config, name)
            for ds, r, w in zip(indexed, ranges, weights)
        ]
        size = sum(surplus_size(n, w, 0.0) for w in weights)
        out.append(BlendedDataset(parts, weights, size, cache_dir=config.cache_dir))
    return tuple(out)
