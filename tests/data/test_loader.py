import pytest
import torch

from longboat.data.loader import ConsecutiveBatchSampler, ResumableLoader
from tests.trainer.conftest import RandomTokens


def test_ranks_split_consecutive_global_batches():
    a = list(ConsecutiveBatchSampler(20, 2, 0, 2))
    b = list(ConsecutiveBatchSampler(20, 2, 1, 2))
    assert a[:2] == [[0, 1], [4, 5]] and b[:2] == [[2, 3], [6, 7]]
    assert sorted(i for batch in a + b for i in batch) == list(range(20))


def test_resume_continues_exactly_with_workers():
    data = RandomTokens(64, 8, 50)
    full = [b["tokens"] for b in ResumableLoader(data, 4, num_workers=2)]
    first = ResumableLoader(data, 4, num_workers=2)
    head = [next(first)["tokens"] for _ in range(5)]
    state = first.state_dict()
    assert state == {"consumed": 20}
    second = ResumableLoader(data, 4, num_workers=2)
    second.load_state_dict(state)
    tail = [b["tokens"] for b in second]
    assert len(full) == 16
    assert all(torch.equal(x, y) for x, y in zip(full, head + tail))


def test_epochs_reshuffle_drop_the_remainder_and_resume_exactly():
    from longboat.data.loader import EpochBatchSampler

    def take(rank, consumed=0, n=10):
        it = iter(EpochBatchSampler(23, 2, rank, 2, global_batch=8, seed=7, consumed=consumed))
        return [next(it) for _ in range(n)]

    a, b = take(0), take(1)
    first_epoch = [i for batch in a[:4] + b[:4] for i in batch]  # 16 of 23 samples: two whole global batches
    assert len(set(first_epoch)) == 16 and all(0 <= i < 23 for i in first_epoch)
    second_epoch = [i for batch in a[4:8] + b[4:8] for i in batch]
    assert len(set(second_epoch)) == 16 and second_epoch != first_epoch  # a new permutation
    assert take(0, consumed=12, n=4) == a[3:7]  # resumed mid-epoch and across the epoch boundary


def test_loader_reports_epochs():
    from longboat.data.loader import EpochOrder

    loader = ResumableLoader(RandomTokens(20, 8, 50), 4, epochs=EpochOrder(global_batch=8, seed=0))
    for _ in range(5):
        next(loader)
    assert loader.epoch == pytest.approx(20 / 16)


class _Positions(torch.utils.data.Dataset):
    """Items that say which row and which stream position the loader asked for."""

    positioned = True

    def __init__(self, n: int = 23):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, key):
        row, position = key
        return {"row": torch.tensor(row), "position": torch.tensor(position)}


class _Runs(_Positions):
    """Rows whose epochs keep runs of neighbours together (a robot video dataset's ``epoch_run``)."""

    epoch_run = 4


def _stream(dataset, global_batch: int, dp_size: int, steps: int, consumed: int = 0, workers: int = 0,
            epochs_seed: int | None = None) -> list[tuple[int, int]]:
    """(row, position) of every sample of ``steps`` global batches, gathered over ``dp_size`` ranks."""
    from longboat.data.loader import EpochOrder

    order = EpochOrder(global_batch=global_batch, seed=epochs_seed) if epochs_seed is not None else None
    loaders = [ResumableLoader(dataset, global_batch // dp_size, rank, dp_size, num_workers=workers,
                               consumed=consumed, epochs=order) for rank in range(dp_size)]
    out = []
    for _ in range(steps):
        batches = [next(loader) for loader in loaders]
        out += [(int(r), int(p)) for b in batches for r, p in zip(b["row"], b["position"])]
    return out


@pytest.mark.parametrize("epochs", [False, True])
def test_positions_number_the_sample_stream_whatever_the_layout(epochs):
    def stream(dp_size, consumed=0, steps=4):
        return _stream(_Positions(), 4, dp_size, steps, consumed, epochs_seed=3 if epochs else None)

    one = stream(1)
    assert [p for _, p in one] == list(range(16))  # the position is the sample's place in the job's stream
    assert stream(2) == one  # the same rows at the same positions on two ranks
    assert stream(1, consumed=8, steps=2) == one[8:]  # and after a resume


def test_epoch_runs_are_shuffled_permutations_of_aligned_neighbour_runs():
    from longboat.data.loader import EpochBatchSampler

    sampler = EpochBatchSampler(42, 4, 0, 1, global_batch=8, seed=5, run=4)
    starts = set()
    for epoch in range(8):
        order = sampler.permutation(epoch).tolist()
        assert sorted(order) == list(range(42))  # a permutation of the rows
        assert order == sampler.permutation(epoch).tolist()  # drawn from (seed, epoch) only
        runs = [order[i : i + 4] for i in range(0, 42, 4)]  # 10 whole runs, then the partial run of 2
        assert all(r == [(r[0] + j) % 42 for j in range(len(r))] for r in runs)  # neighbours, in order
        start = (runs[-1][0] - 40) % 42  # the partial run holds the last 2 rows from the epoch's start
        assert {r[0] for r in runs[:10]} == {(start + 4 * k) % 42 for k in range(10)}  # the runs tile the rows
        assert [r[0] for r in runs[:10]] != sorted(r[0] for r in runs[:10])  # the runs are shuffled
        starts.add(start)
    assert len(starts) > 4  # where runs begin, and so which rows end the epoch, moves
    plain = EpochBatchSampler(42, 4, 0, 1, global_batch=8, seed=5)
    assert plain.permutation(0).tolist() == torch.randperm(42, generator=torch.Generator().manual_seed(5 * 1_000_003)).tolist()


def test_epoch_runs_resume_exactly_with_workers_and_ranks():
    def stream(dp_size, consumed=0, steps=8, workers=0):
        return _stream(_Runs(42), 8, dp_size, steps, consumed, workers, epochs_seed=1)

    one = stream(1)
    rows = [r for r, _ in one]
    assert [p for _, p in one] == list(range(64))
    assert len(set(rows[:40])) == 40  # an epoch (5 global batches of 8) repeats no row
    assert all(rows[i : i + 4] == list(range(rows[i], rows[i] + 4)) for i in range(0, 32, 4))  # runs of neighbours
    assert stream(2) == one and stream(1, workers=2) == one
    assert stream(1, consumed=24, steps=5, workers=2) == one[24:]  # resumed mid-epoch and across its end


class Ragged(torch.utils.data.Dataset):
    """Items of different lengths, which only the dataset's own collate can batch."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"values": torch.full((i,), i)}

    @staticmethod
    def collate(items: list[dict]) -> dict[str, torch.Tensor]:
        return {"values": torch.cat([item["values"] for item in items])}


@pytest.mark.parametrize("workers", [0, 1])
def test_a_dataset_with_a_collate_builds_its_batches(workers):
    batches = [b["values"].tolist() for b in ResumableLoader(Ragged(), 2, num_workers=workers)]
    assert batches == [[1], [2, 2, 3, 3, 3], [4] * 4 + [5] * 5, [6] * 6 + [7] * 7]
