"""The policy task's samples on both paths: transformed in the loader workers, or left untransformed (cameras uint8)
and transformed as a batch where training runs (``data.transforms_on``), with the same keyed draws, so the batches,
the losses and a short training run agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import default_collate

from longboat.cli.main import main
from longboat.models.policy.mlp import MLPPolicy
from longboat.recipes.config import resolve
from longboat.tasks.policy_data import BatchTransforms
from longboat.trainer.config import TrainerConfig
from longboat.trainer.metrics import read_metrics
from tests.tasks.policy_dataset import write_policy_dataset

CAMERA = "observation.images.top"
# Every drawing transform and the geometry before it, then normalisation of the camera, the state and the action.
TRANSFORMS = [
    {"type": "resize_pad", "keys": [CAMERA], "size": [14, 18]},
    {"type": "random_crop", "keys": [CAMERA], "size": [10, 14]},
    {"type": "color_jitter", "keys": [CAMERA], "brightness": 0.3, "contrast": 0.3, "saturation": 0.3, "hue": 0.05},
    {"type": "normalize", "features": {CAMERA: "mean_std", "observation.state": "mean_std", "action": "min_max"}},
]
INDICES = [(7, 123), (3, 5), (19, 0), (11, 77)]  # (row, position in the sample stream)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_policy_dataset(tmp_path_factory.mktemp("policy_data") / "ds")


def run_config(dataset: Path, run_dir: Path, transforms_on: str) -> dict:
    return {"task": "policy", "run_dir": str(run_dir), "seed": 3,
            "model": {"arch": "mlp", "preset": "tiny", "n_obs_steps": 2, "horizon": 5},
            "data": {"path": str(dataset), "transforms": TRANSFORMS, "valid_episodes": [4],
                     "transforms_on": transforms_on},
            "train": {"steps": 3, "micro_batch_size": 4, "num_workers": 0, "log_every": 1, "eval_every": 3,
                      "eval_batches": 1, "device": "cpu", "tensorboard": False}}


def built(dataset: Path, tmp_path: Path, transforms_on: str):
    resolved = resolve(run_config(dataset, tmp_path / transforms_on, transforms_on))
    task = resolved.task
    return task, resolved.model, task.build(resolved.model, resolved.cfg.train, 3, 1)


def assert_same_batch(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype, key
            torch.testing.assert_close(got[key], value, rtol=0, atol=1e-6, msg=lambda m: f"{key}: {m}")
        else:
            assert got[key] == value, key


def test_batches_transformed_on_the_device_equal_those_of_the_workers(dataset, tmp_path):
    _, cfg, workers = built(dataset, tmp_path, "workers")
    _, _, device = built(dataset, tmp_path, "device")
    for split in ("train", "valid"):
        ours, theirs = getattr(device, split), getattr(workers, split)
        raw = default_collate(ours.__getitems__(INDICES))
        assert raw[CAMERA].dtype == torch.uint8 and raw[CAMERA].shape == (4, 2, 3, 12, 16)  # as stored
        want = default_collate(theirs.__getitems__(INDICES))
        got = BatchTransforms(ours.pipeline, cfg, ours.frames.to_float)(raw)
        assert got[CAMERA].shape == (4, 2, 3, 10, 14)
        assert_same_batch(got, want)
    # The losses: the device path's loss transforms the raw batch itself, by the model's mode.
    torch.manual_seed(0)
    model = MLPPolicy(cfg)
    for mode, split in ((True, "train"), (False, "valid")):
        model.train(mode)
        raw = default_collate(getattr(device, split).__getitems__(INDICES))
        want = default_collate(getattr(workers, split).__getitems__(INDICES))
        got, ref = device.loss_fn(model, raw), workers.loss_fn(model, want)
        torch.testing.assert_close(got.loss_sum, ref.loss_sum, rtol=0, atol=1e-6)
        assert got.metrics.keys() == ref.metrics.keys() and ("action_mae" in got.metrics) == (not mode)
        for key, value in ref.metrics.items():
            torch.testing.assert_close(torch.as_tensor(got.metrics[key]), torch.as_tensor(value), rtol=0, atol=1e-6)


def test_auto_keeps_the_workers_on_a_cpu(dataset, tmp_path):
    task, _, data = built(dataset, tmp_path, "auto")
    assert data.summary["transforms_on"] == "workers" and data.train[INDICES[0]][CAMERA].dtype == torch.float32
    assert task.transforms_on_device(TrainerConfig(steps=1, device="cpu")) is False


def test_a_run_with_the_transforms_on_the_device_trains_as_with_them_in_the_workers(dataset, tmp_path):
    for on in ("workers", "device"):
        path = tmp_path / f"{on}.yaml"
        path.write_text(json.dumps(run_config(dataset, tmp_path / on, on)))
        assert main(["train", str(path)]) == 0
    train = [read_metrics(tmp_path / on) for on in ("workers", "device")]
    valid = [read_metrics(tmp_path / on, "valid") for on in ("workers", "device")]
    assert len(train[0]) == 3 and len(valid[0]) == 1
    for got, want in zip(train[1] + valid[1], train[0] + valid[0]):
        for key in ("loss", "grad_norm", "action_mae"):
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
