"""Learning-rate schedules: warmup then cosine or warmup-stable-decay, and their config checks."""

import math

import pytest

from longboat.config.base import ConfigError, validate
from longboat.trainer.schedule import ScheduleConfig, lr_multiplier


def test_cosine_warms_up_then_decays_to_min():
    cfg = ScheduleConfig(kind="cosine", warmup_steps=10, min_lr_ratio=0.1)
    m = [lr_multiplier(s, 100, cfg) for s in range(100)]
    assert m[0] == pytest.approx(0.1) and m[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(m[:10], m[1:10]))
    assert all(a >= b for a, b in zip(m[10:], m[11:]))
    assert m[-1] == pytest.approx(0.1, abs=1e-3)
    assert lr_multiplier(55, 100, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_wsd_is_flat_then_decays():
    cfg = ScheduleConfig(kind="wsd", warmup_steps=5, decay_fraction=0.2, min_lr_ratio=0.0)
    m = [lr_multiplier(s, 100, cfg) for s in range(100)]
    assert m[5:80] == [1.0] * 75
    assert m[80] < 1.0 and m[-1] == pytest.approx(0.0)
    sqrt = ScheduleConfig(kind="wsd", decay_fraction=0.5, decay_shape="sqrt", min_lr_ratio=0.0)
    assert lr_multiplier(74, 100, sqrt) < lr_multiplier(74, 100, ScheduleConfig(kind="wsd", decay_fraction=0.5,
                                                                                    min_lr_ratio=0.0))


def test_schedule_validation():
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        validate(ScheduleConfig, {"min_lr_ratio": 2})

