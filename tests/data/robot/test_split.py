"""The split of a dataset's episodes into training and validation: seeded, disjoint, never leaving training empty."""

import pytest

from longboat.data.robot import RobotDataError, split_episodes


def test_split_by_episode_is_seeded_and_disjoint():
    train, valid = split_episodes(range(10), 0.2, seed=3)
    assert len(valid) == 2 and sorted(train + valid) == list(range(10)) and not set(train) & set(valid)
    assert split_episodes(range(10), 0.2, seed=3) == (train, valid)
    assert any(split_episodes(range(10), 0.2, seed=s)[1] != valid for s in range(4, 10))
    assert split_episodes([4, 5, 6], 0.01, seed=0)[1] != []  # a positive fraction keeps one episode
    with pytest.raises(RobotDataError, match="leaves none for training"):
        split_episodes([1], 0.5, seed=0)
