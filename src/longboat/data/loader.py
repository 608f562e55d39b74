"""A resumable, data-parallel loader over map-style datasets whose order is fixed by the dataset itself.

The state is one integer, the number of samples the whole job has consumed, so resumption is exact on any
number of workers. Each global micro-batch of ``micro_batch_size * dp_size`` consecutive samples is split
between data-parallel ranks, as Megatron's pretraining sampler does.
"""

from __future__ import annotations

import signal
from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


def _ignore_sigterm(worker_id: int) -> None:
    """Preemption signals the whole process group; the main process saves a checkpoint and ends workers."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class ConsecutiveBatchSampler(Sampler[list[int]]):
    """Yields this rank's slice of consecutive global micro-batches, starting at ``consumed``."""

    def __init__(self, dataset_len: int, micro_batch_size: int, dp_rank: int, dp_size: int, consumed: int = 0):
        self.n, self.mbs, self.rank, self.world = dataset_len, micro_batch_size, dp_rank, dp_size
        self.consumed = consumed

    def __iter__(self) -> Iterator[list[int]]:
        step = self.mbs * self.world
        start = self.consumed
        while start + step <= self.n:
            first = start + self.rank * self.mbs
            yield list(range(first, first + self.mbs))
            start += step

    def __len__(self) -> int:
        return max(self.n - self.consumed, 0) // (self.mbs * self.world)


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
    ):
        self.dataset, self.mbs, self.dp_rank, self.dp_size = dataset, micro_batch_size, dp_rank, dp_size
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.consumed = consumed
        self._iter: Iterator | None = None

    @property
    def global_micro_batch(self) -> int:
        return self.mbs * self.dp_size

    def _make_iter(self) -> Iterator:
        sampler = ConsecutiveBatchSampler(len(self.dataset), self.mbs, self.dp_rank, self.dp_size, self.consumed)
        loader = DataLoader(
            self.dataset,
            batch_sampler=sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=False,
            worker_init_fn=_ignore_sigterm if self.num_workers else None,
            prefetch_factor=4 if self.num_workers else None,
        )
        return iter(loader)

    def __iter__(self) -> "ResumableLoader":
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._iter is None:
            self._iter = self._make_iter()
        batch = next(self._iter)  # StopIteration ends the data, by design: the dataset was sized for the run
        self.consumed += self.global_micro_batch
        return batch

    def state_dict(self) -> dict:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = int(state["consumed"])
        self._iter = None
