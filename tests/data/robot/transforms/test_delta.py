"""``delta_actions``: actions relative to the current state on chosen dims, and back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from longboat.data.robot.transforms import TransformError
from tests.data.robot.transforms.conftest import ACTION, STATE, build


def test_delta_actions_subtract_the_current_state_on_chosen_dims_and_add_it_back():
    p = build([{"type": "delta_actions", "dims": [0, 2, 3]}])
    action, history = torch.randn(2, 10, 5), torch.randn(2, 3, 6)  # a state history [B, T, D]: its last is now
    out = p.apply({ACTION: action, STATE: history})
    ref = action.numpy().copy()
    ref[..., [0, 2, 3]] -= history.numpy()[:, -1:, [0, 2, 3]]
    np.testing.assert_array_equal(out[ACTION].numpy(), ref)
    torch.testing.assert_close(p.unapply(out)[ACTION], action, atol=1e-6, rtol=0)
    single = build([{"type": "delta_actions"}]).apply({ACTION: action[0], STATE: history[0, -1, :5]})
    np.testing.assert_allclose(single[ACTION].numpy(), action[0].numpy() - history[0, -1, :5].numpy())


def test_delta_actions_errors_name_the_keys():
    p = build([{"type": "delta_actions", "dims": [6]}])
    with pytest.raises(TransformError, match=r"has 'action' but no 'observation.state' to make it absolute"):
        p.unapply({ACTION: torch.randn(4, 7)})
    with pytest.raises(TransformError, match=r"dims \[6\] reach past 'action' \(7\) or 'observation.state' \(6\)"):
        p.apply({ACTION: torch.randn(4, 7), STATE: torch.randn(6)})
