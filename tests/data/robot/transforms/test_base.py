"""The transform base: a missing image is named with the item's keys, and user transforms register by name."""

from __future__ import annotations

import pytest
import torch

from longboat.config.base import StrictModel
from longboat.data.robot.transforms import Transform, TransformError, register_transform, transform_names
from longboat.data.robot.transforms import base as transforms_base
from longboat.utils.registry import RegistryError
from tests.data.robot.transforms.conftest import ACTION, TOP, build


def test_a_missing_image_names_the_key_and_the_item_keys():
    with pytest.raises(TransformError, match=r"^resize_pad: the item has no 'observation.images.top'; it has: action$"):
        build([{"type": "resize_pad", "keys": [TOP], "size": [8, 8]}]).apply({ACTION: torch.zeros(3)})


def test_user_transforms_register_by_name(monkeypatch):
    monkeypatch.setattr(transforms_base, "_TRANSFORMS", transforms_base._TRANSFORMS.copy())  # leave no trace
    class ScaleConfig(StrictModel):
        key: str
        factor: float

    @register_transform("test_scale")
    class Scale(Transform):
        Config = ScaleConfig
        invertible = True

        def apply(self, item, generator=None):
            return {**item, self.cfg.key: item[self.cfg.key] * self.cfg.factor}

        def unapply(self, item):
            return {**item, self.cfg.key: item[self.cfg.key] / self.cfg.factor}

    assert "test_scale" in transform_names()
    p = build([{"type": "test_scale", "key": ACTION, "factor": 4.0}, {"type": "pad_horizon", "horizon": 3}])
    out = p.apply({ACTION: torch.ones(2, 1)})
    assert out[ACTION].tolist() == [[4.0], [4.0], [4.0]]
    assert p.unapply(out)[ACTION].tolist() == [[1.0], [1.0], [1.0]]
    assert register_transform("test_scale")(Scale) is Scale  # the same class again (a module imported twice)
    with pytest.raises(RegistryError, match=r"transform 'test_scale' registered twice: first by .*\.Scale "
                                            r"\(tests/data/robot/transforms/test_base.py:\d+\), again by .*\.Other "):
        @register_transform("test_scale")
        class Other(Scale):
            pass
