"""``pad_dim`` and ``pad_horizon``: zero padding sliced back to the stats' size, chunks padded with a mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from longboat.config.base import ConfigError
from longboat.data.robot.transforms import TransformError
from tests.data.robot.transforms.conftest import ACTION, STATE, build


def test_pad_dim_zero_pads_and_slices_back_to_the_stats_size(stats):
    p = build([{"type": "pad_dim", "keys": [STATE, ACTION], "dim": 12}], stats)
    item = {STATE: torch.randn(4, 9), ACTION: torch.randn(4, 50, 7)}
    out = p.apply(item)
    np.testing.assert_array_equal(out[ACTION].numpy(), np.pad(item[ACTION].numpy(), [(0, 0), (0, 0), (0, 5)]))
    np.testing.assert_array_equal(out[STATE].numpy(), np.pad(item[STATE].numpy(), [(0, 0), (0, 3)]))
    back = p.unapply({ACTION: out[ACTION] + 1})  # a model's output: the padding is not zero any more
    np.testing.assert_array_equal(back[ACTION].numpy(), item[ACTION].numpy() + 1)
    with pytest.raises(TransformError, match=r"pad_dim: 'action' has 8 dimensions, expected 7"):
        p.apply({ACTION: torch.randn(50, 8)})
    with pytest.raises(ConfigError, match=r"pad_dim: 'observation.state' has 9 dimensions .*more than dim=8"):
        build([{"type": "pad_dim", "keys": [STATE], "dim": 8}], stats)


@pytest.mark.parametrize("fill", ["last", "zeros"])
def test_pad_horizon_pads_the_chunk_and_extends_the_mask(fill):
    chunk = torch.randn(2, 30, 7)
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[1, 25:] = True  # the dataset's own padding past an episode's end
    out = build([{"type": "pad_horizon", "horizon": 50, "fill": fill}]).apply({ACTION: chunk, "action_is_pad": mask})
    tail = np.repeat(chunk.numpy()[:, -1:], 20, 1) if fill == "last" else np.zeros((2, 20, 7), np.float32)
    np.testing.assert_array_equal(out[ACTION].numpy(), np.concatenate([chunk.numpy(), tail], 1))
    expected = np.concatenate([mask.numpy(), np.ones((2, 20), bool)], 1)
    np.testing.assert_array_equal(out["action_is_pad"].numpy(), expected)


def test_pad_horizon_writes_a_mask_and_refuses_long_chunks():
    p = build([{"type": "pad_horizon", "horizon": 4}])
    out = p.apply({ACTION: torch.randn(4, 3)})
    assert out["action_is_pad"].dtype == torch.bool and not out["action_is_pad"].any()
    with pytest.raises(TransformError, match=r"pad_horizon: 'action' has 5 steps, more than horizon=4"):
        p.apply({ACTION: torch.randn(5, 3)})
