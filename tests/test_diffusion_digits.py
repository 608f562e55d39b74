"""The digits recipe end to end at reduced steps: train configs/diffusion/digits.yaml, then `longboat sample --metrics`
writes the images, the grid and the metrics of a model that has begun to learn."""

import json
from pathlib import Path

import pytest

from longboat.cli.main import main
from longboat.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "diffusion" / "digits.yaml"


def test_the_digits_recipe_trains_and_samples(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", str(CONFIG), f"run_dir={run}", "train.steps=60", "train.log_every=10",
                 "train.eval_batches=1", "train.threads=null", "train.tensorboard=false"]) == 0
    losses = [r["loss"] for r in read_metrics(run)]
    assert losses[-1] < 0.8 * losses[0], losses
    capsys.readouterr()
    out = tmp_path / "samples"
    assert main(["sample", str(run), "--num", "3", "--steps", "8", "--cfg", "2", "--metrics", "--out", str(out)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores == json.loads((out / "metrics.json").read_text())
    assert scores["num_images"] == 30 and len(list(out.glob("0*.png"))) == 30 and (out / "grid.png").is_file()
    assert scores["frechet"] > 0 and 0 <= scores["accuracy"] <= 1 and scores["classifier_real_accuracy"] > 0.9
