"""Runs, checkpoints and exports written by format 1 (before task assets, EMA and checkpoint manifests) still
open, generate, export and resume. ``tests/fixtures/format1_run`` was written by that version's
``longboat train`` (1 layer, d_model 16, 2 steps, on the stdlib corpus of ``tests/conftest.py``)."""

import json
import shutil

import pytest
import torch
import yaml

from longboat.recipes.artifact import open_artifact
from longboat.trainer.metrics import read_metrics
from tests.conftest import REPO, run_longboat

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "format1_run"


@pytest.fixture
def old_run(tmp_path, corpus):
    """The fixture run, moved: its config now points at this machine's corpus."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    tokenizer, prefix = corpus
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["run_dir"], cfg["data"]["tokenizer"], cfg["data"]["paths"] = str(run), str(tokenizer), [{"path": prefix}]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


def test_format1_export_and_checkpoint_open(old_run):
    assert json.loads((old_run / "export" / "longboat_config.json").read_text())["format_version"] == 1
    export = open_artifact(old_run / "export")
    checkpoint = open_artifact(old_run / "checkpoints" / "step_00000002")
    assert export.task is None and not export.ema and "tokenizer.json" in export.assets
    assert checkpoint.task == "pretrain" and not checkpoint.ema
    tokens = torch.randint(0, 512, (2, 16))
    torch.testing.assert_close(export.model(tokens), checkpoint.model(tokens), rtol=0, atol=0)


def test_format1_generates_exports_and_resumes(old_run, tmp_path):
    gen = run_longboat("generate", str(old_run / "export"), "--prompt", "def ", "--max-new-tokens", "4",
                       "--temperature", "0", check=True)
    assert gen.stdout.startswith("def ")
    run_longboat("export", str(old_run), "--output", str(tmp_path / "new_export"), check=True)
    meta = json.loads((tmp_path / "new_export" / "longboat_config.json").read_text())
    assert meta["format_version"] == 2 and meta["task"] == "pretrain" and "tokenizer.json" in meta["assets"]
    resumed = run_longboat("train", str(old_run / "config.yaml"), "train.steps=3", "checkpoint.export=false",
                           check=True)
    assert "resumed from" in resumed.stdout and "step_00000002" in resumed.stdout
    assert [r["step"] for r in read_metrics(old_run)] == [3]
    assert json.loads((old_run / "checkpoints" / "step_00000003" / "checkpoint.json").read_text())["format_version"] == 2
