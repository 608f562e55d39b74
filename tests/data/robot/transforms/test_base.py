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


def test_a_drawing_transform_without_a_batch_form_runs_sample_by_sample(monkeypatch):
    monkeypatch.setattr(transforms_base, "_TRANSFORMS", transforms_base._TRANSFORMS.copy())  # leave no trace

    class JiggleConfig(StrictModel):
        key: str

    @register_transform("test_jiggle")
    class Jiggle(Transform):
        Config = JiggleConfig

        def apply(self, item, generator=None):
            x = item[self.cfg.key]
            return {**item, self.cfg.key: x + torch.rand(x.shape, generator=generator)}

    pipeline = build([{"type": "test_jiggle", "key": ACTION}, {"type": "pad_horizon", "horizon": 4}])
    batch = {ACTION: torch.zeros(3, 2, 5), "task": ["a", "b", "c"]}

    def generators():
        return [torch.Generator().manual_seed(i) for i in range(3)]

    out = pipeline.apply_batch(batch, generators())
    alone = [pipeline.apply({ACTION: batch[ACTION][i]}, g) for i, g in enumerate(generators())]
    assert torch.equal(out[ACTION], torch.stack([a[ACTION] for a in alone])) and out[ACTION].shape == (3, 4, 5)
    assert torch.equal(out[f"{ACTION}_is_pad"], torch.stack([a[f"{ACTION}_is_pad"] for a in alone]))
    assert out["task"] == ["a", "b", "c"] and len(set(out[ACTION][:, 0, 0].tolist())) == 3
