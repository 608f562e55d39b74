"""A resumable, data-parallel loader over map-style datasets.

The state is one integer, the number of samples the whole job has consumed, so resumption is exact on any
number of workers and ranks. Each global micro-batch of ``micro_batch_size * dp_size`` samples is split between
data-parallel ranks, as Megatron's pretraining sampler does. The samples come either in the dataset's own order
(pretraining: the GPT dataset already shuffled them, Megatron's way) or, for finite datasets, in epochs: each
epoch is a permutation drawn from (seed, epoch), of which whole global batches are used; the remainder of an
epoch that does not fill a global batch is dropped. A dataset whose ``epoch_run`` is above 1 (robot video: samples
of neighbouring rows share frames to decode) gets permutations that keep runs of that many neighbouring rows
together, in order: the runs are shuffled, and where they begin moves from epoch to epoch. A dataset with a
``collate`` function builds its own batches (rows that carry a varying number of images).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


@dataclass(frozen=True)
class EpochOrder:
    """Read a finite dataset in reshuffled epochs of whole ``global_batch``es."""

    global_batch: int
    seed: int


def _own_process_group(worker_id: int) -> None:
    """Keep preemption's SIGTERM to the job's process group from killing workers mid-step: the main process
    saves a checkpoint first. A SIGTERM sent to the worker itself (the loader's shutdown, interpreter exit after
    an error) still ends it, and a worker whose parent died exits by the loader's own watchdog."""
    os.setpgrp()


class ConsecutiveBatchSampler(Sampler[list[int]]):
    """Yields this rank's slice of consecutive global micro-batches, starting at ``consumed``."""

    def __init__(self, dataset_len: int, micro_batch_size: int, dp_rank: int, dp_size: int, consumed: int = 0,
                 positioned: bool = False):
        self.n, self.mbs, self.rank, self.world = dataset_len, micro_batch_size, dp_rank, dp_size
        self.consumed, self.positioned = consumed, positioned

    def __iter__(self) -> Iterator[list]:
        step = self.mbs * self.world
        start = self.consumed
        while start + step <= self.n:
            first = start + self.rank * self.mbs
            rows = range(first, first + self.mbs)
            yield [(r, r) for r in rows] if self.positioned else list(rows)
            start += step

    def __len__(self) -> int:
        return max(self.n - self.consumed, 0) // (self.mbs * self.world)


class EpochBatchSampler(Sampler[list[int]]):
    """Endless epochs of a finite dataset: this rank's slice of each global micro-batch of a permutation.

    ``global_batch`` (micro-batch × accumulation × data-parallel size) fixes the samples used per epoch: the
    largest multiple of it that fits the dataset. The permutation of epoch ``e`` depends on (seed, e, run) only.
    """

    def __init__(self, dataset_len: int, micro_batch_size: int, dp_rank: int, dp_size: int, global_batch: int,
                 seed: int, consumed: int = 0, positioned: bool = False, run: int = 1):
        self.mbs, self.rank, self.world, self.seed, self.consumed = micro_batch_size, dp_rank, dp_size, seed, consumed
        self.positioned, self.run = positioned, run
        self.n = dataset_len
        self.per_epoch = samples_per_epoch(dataset_len, global_batch)

    def permutation(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        if self.run == 1 or self.n <= self.run:
            return torch.randperm(self.n, generator=g)
        return run_permutation(self.n, self.run, g)

    def __iter__(self) -> Iterator[list]:
        step = self.mbs * self.world
        epoch, offset = divmod(self.consumed, self.per_epoch)
        while True:
            order = self.permutation(epoch)
            for start in range(offset, self.per_epoch, step):
                first = start + self.rank * self.mbs
                rows = order[first : first + self.mbs].tolist()
                if self.positioned:
                    base = epoch * self.per_epoch + first
                    rows = [(r, base + j) for j, r in enumerate(rows)]
                yield rows
            epoch, offset = epoch + 1, 0


def run_permutation(n: int, run: int, g: torch.Generator) -> torch.Tensor:
    """The rows from a random start, wrapping around, cut into runs of ``run`` neighbours; the whole runs shuffled,
    each in order, then the partial run. Runs stay aligned to multiples of ``run`` in the epoch, so a micro-batch of
    ``run`` rows (or a divisor or multiple of it) holds whole runs; the random start moves the runs' boundaries and
    the partial run (the rows most often left out of an epoch's whole global batches) from epoch to epoch."""
    rows = (torch.arange(n) + int(torch.randint(n, (1,), generator=g))) % n
    full = n // run
    runs = rows[: full * run].view(full, run)[torch.randperm(full, generator=g)].flatten()
    return torch.cat([runs, rows[full * run :]])


def samples_per_epoch(dataset_len: int, global_batch: int) -> int:
    return dataset_len // global_batch * global_batch


class ResumableLoader:
    """Iterates micro-batches for one rank and knows how many samples the job has consumed."""

    def __init__(
        self,
        dataset: Dataset,
        micro_batch_size: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        num_workers: int = 0,
        consumed: int = 0,
        pin_memory: bool = False,
        epochs: EpochOrder | None = None,
    ):
        self.dataset, self.mbs, self.dp_rank, self.dp_size = dataset, micro_batch_size, dp_rank, dp_size
        self.num_workers, self.pin_memory, self.epochs = num_workers, pin_memory, epochs
        self.consumed = consumed
        self._iter: Iterator | None = None

    @property
    def global_micro_batch(self) -> int:
        return self.mbs * self.dp_size

    @property
    def epoch(self) -> float | None:
        """Epochs completed so far (fractional), for finite datasets read in epochs."""
        if self.epochs is None:
            return None
        return self.consumed / samples_per_epoch(len(self.dataset), self.epochs.global_batch)

    def _make_iter(self) -> Iterator:
        positioned = bool(getattr(self.dataset, "positioned", False))
        if self.epochs is not None:
            sampler = EpochBatchSampler(len(self.dataset), self.mbs, self.dp_rank, self.dp_size,
                                        self.epochs.global_batch, self.epochs.seed, self.consumed, positioned,
                                        run=int(getattr(self.dataset, "epoch_run", 1)))
        else:
            sampler = ConsecutiveBatchSampler(len(self.dataset), self.mbs, self.dp_rank, self.dp_size, self.consumed,
                                              positioned)
        loader = DataLoader(
            self.dataset,
            batch_sampler=sampler,
            collate_fn=getattr(self.dataset, "collate", None),  # a dataset's own, e.g. rows with their images
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=False,
            worker_init_fn=_own_process_group if self.num_workers else None,
            prefetch_factor=4 if self.num_workers else None,
        )
        return iter(loader)

    def __iter__(self) -> "ResumableLoader":
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._iter is None:
            self._iter = self._make_iter()
        batch = next(self._iter)  # only a dataset read in its own order ends; the trainer checks its size first
        self.consumed += self.global_micro_batch
        return batch

    def state_dict(self) -> dict:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = int(state["consumed"])
        self._iter = None
