"""``select_dims``: the chosen state dims after normalizing the whole state; dims past the feature refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from longboat.config.base import ConfigError
from longboat.data.robot.transforms import TransformError
from tests.data.robot.transforms.conftest import ACTION, STATE, build, numpy_normalize


def test_select_dims_keeps_chosen_state_dims_after_normalizing_the_whole_state(stats):
    p = build([{"type": "normalize", "features": {STATE: "mean_std", ACTION: "min_max"}},
               {"type": "select_dims", "dims": [3, 0, 1]}], stats)
    history, action = torch.randn(2, 3, 9), torch.randn(2, 10, 7)  # [B, T, D] state, [B, H, A] action
    out = p.apply({STATE: history, ACTION: action})
    full = numpy_normalize(history.numpy(), stats, STATE, "mean_std")
    np.testing.assert_allclose(out[STATE].numpy(), full[..., [3, 0, 1]], rtol=1e-6)
    back = p.unapply({STATE: out[STATE], ACTION: out[ACTION]})  # as a policy bundle walks back: state as context
    torch.testing.assert_close(back[ACTION], action, atol=1e-5, rtol=0)
    assert STATE not in back  # the dropped dims cannot be restored, so normalize's inverse never sees 3 of 9
    assert p.apply({ACTION: action})[ACTION].shape == action.shape  # an item without the feature passes


def test_select_dims_refuses_dims_past_the_feature_and_an_empty_list():
    with pytest.raises(TransformError, match=r"select_dims: dims \[0, 9\] reach past 'observation.state', "
                                             r"which has 9 dimensions"):
        build([{"type": "select_dims", "dims": [0, 9]}]).apply({STATE: torch.randn(4, 9)})
    with pytest.raises(ConfigError, match=r"'transforms\[0\].dims'"):
        build([{"type": "select_dims", "dims": []}])
