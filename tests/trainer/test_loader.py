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
