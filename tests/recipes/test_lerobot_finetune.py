"""An imported LeRobot ACT fine-tuned by ``longboat train`` (``model: {lerobot: DIR}``) on the LeRobot dataset fixture:
it starts from the policy's weights and normalisation, and a run resumed from its own saved config (the LeRobot
directory gone) ends bitwise where a straight run does."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from longboat.recipes import train
from longboat.recipes.config import resolve
from longboat.recipes.convert import lerobot_to_longboat

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))

from lerobot_policy_weights import write_weights  # noqa: E402


def _lerobot_act(tmp_path: Path) -> Path:
    target = tmp_path / "lerobot_act"
    shutil.copytree(FIXTURES / "lerobot_policies" / "act", target)
    write_weights(target)
    return target


def _config(run_dir: Path, source: Path, steps: int) -> dict:
    return {"task": "policy", "run_dir": str(run_dir), "seed": 3, "model": {"lerobot": str(source)},
            "data": {"path": str(FIXTURES / "lerobot_v30" / "dataset")},
            "train": {"steps": steps, "micro_batch_size": 4, "num_workers": 0, "log_every": 1, "eval_every": 0,
                      "tensorboard": False, "threads": 1, "optimizer": {"lr": 1e-3, "weight_decay": 0.0},
                      "schedule": {"kind": "constant"}},
            "checkpoint": {"every": 0}}


@pytest.mark.slow  # three short runs of an 11M-parameter ACT (about 17 s)
def test_imported_act_fine_tunes_and_resumes_bitwise(tmp_path):
    source = _lerobot_act(tmp_path)
    imported = load_file(lerobot_to_longboat(source, tmp_path / "imported") / "model.safetensors")
    straight = _config(tmp_path / "a", source, steps=4)
    train.run(resolve(straight))
    saved = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert "lerobot" not in saved["model"] and saved["model"]["arch"] == "act"
    assert saved["data"]["transforms"][0]["features"]["observation.images.cam"] == "mean_std"
    assert saved["data"]["stats"]["action"]["mean"]  # LeRobot's statistics, not the dataset's

    interrupted = _config(tmp_path / "b", source, steps=2)
    train.run(resolve(interrupted))
    shutil.rmtree(source)  # the resume reads the run's own config
    resumed = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())
    resumed["train"]["steps"] = 4
    train.run(resolve(resumed))

    a = load_file(tmp_path / "a" / "export" / "model.safetensors")
    b = load_file(tmp_path / "b" / "export" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Trained from the imported weights: moved, but close (4 steps of lr 1e-3); the frozen batch norm unchanged.
    moved = a["action_head.weight"] - imported["action_head.weight"]
    assert 0 < moved.abs().max() < 0.05
    assert torch.equal(a["backbone.stem.1.running_var"], imported["backbone.stem.1.running_var"])


@pytest.mark.slow  # a short run of a ResNet-18 Diffusion Policy with validation (about 5 s)
def test_imported_diffusion_fine_tunes_on_lerobots_action_window(tmp_path):
    from longboat.tasks.policy_data import delta_timestamps
    from longboat.trainer.metrics import read_metrics

    source = tmp_path / "lerobot_diffusion"
    shutil.copytree(FIXTURES / "lerobot_policies" / "diffusion", source)
    write_weights(source)
    cfg = _config(tmp_path / "run", source, steps=2)
    cfg["data"]["valid_episodes"] = [2]
    cfg["train"].update({"eval_every": 2, "eval_batches": 1})
    resolved = resolve(cfg)
    # LeRobot's window: the chunk starts at the first observed frame, predict returns it from the current one.
    assert delta_timestamps(resolved.model, 10)["action"][:2] == [-0.1, 0.0]
    train.run(resolved)
    valid = read_metrics(tmp_path / "run", "valid")
    assert valid and valid[-1]["action_mae"] > 0
