"""``normalize`` against numpy: mean/std, min/max and quantile modes, their inverses and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from longboat.config.base import ConfigError
from longboat.data.robot.transforms import TransformError
from tests.data.robot.transforms.conftest import ACTION, STATE, TOP, build, numpy_normalize


@pytest.mark.parametrize("mode", ["mean_std", "min_max", "quantiles"])
@pytest.mark.parametrize("shape", [(7,), (4, 7), (2, 50, 7)])
def test_normalize_matches_numpy_and_inverts(stats, mode, shape):
    p = build([{"type": "normalize", "features": {ACTION: mode}}], stats)
    x = torch.randn(shape, dtype=torch.float64) * 3  # float64 in: float32 out
    y = p.apply({ACTION: x})[ACTION]
    assert y.dtype == torch.float32 and y.shape == x.shape
    np.testing.assert_array_equal(y.numpy(), numpy_normalize(x.numpy(), stats, ACTION, mode))
    back = p.unapply({ACTION: y})[ACTION]
    np.testing.assert_allclose(back.numpy(), x.numpy(), rtol=0, atol=2e-6 * (1 + x.abs().max().item()))


def test_quantiles_map_q01_q99_to_minus_one_one(stats):
    p = build([{"type": "normalize", "features": {ACTION: "quantiles"}, "eps": 0}], stats)
    q = torch.tensor(np.stack([stats[ACTION]["q01"], stats[ACTION]["q99"]]), dtype=torch.float32)
    y = p.apply({ACTION: q})[ACTION]
    torch.testing.assert_close(y, torch.tensor([[-1.0] * 7, [1.0] * 7]), atol=1e-5, rtol=0)


def test_normalize_images_per_channel_identity_and_absent_features(stats):
    p = build([{"type": "normalize", "features": {TOP: "mean_std", STATE: "identity", ACTION: "min_max"}}], stats)
    img, state = torch.rand(2, 5, 3, 8, 8), torch.randn(9)
    out = p.apply({TOP: img, STATE: state, "task": "pick"})  # no action: an inference observation
    torch.testing.assert_close(out[TOP], (img - 0.5) / (0.25 + 1e-6))
    assert out[STATE] is state and out["task"] == "pick" and ACTION not in out
    assert p.state_dict().keys() == {f"{TOP}/mean", f"{TOP}/std", f"{ACTION}/min", f"{ACTION}/max"}


def test_normalize_refuses_an_empty_range_and_a_wrong_shape(stats):
    stats[ACTION]["max"] = stats[ACTION]["min"].copy()
    with pytest.raises(ConfigError, match=r"'action' give a min_max range that is not positive"):
        build([{"type": "normalize", "features": {ACTION: "min_max"}, "eps": 0}], stats)
    p = build([{"type": "normalize", "features": {STATE: "mean_std"}}], stats)
    with pytest.raises(TransformError, match=r"'observation.state' has shape \[2, 7\], which does not end in .*\[9\]"):
        p.apply({STATE: torch.zeros(2, 7)})
