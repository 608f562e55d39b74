"""A run killed with SIGKILL (between steps, or while writing a checkpoint) resumes bitwise on CPU."""

import os
import signal
import subprocess
import sys
import time

import pytest

from longboat.checkpoint.dcp import FAULT_ENV
from longboat.trainer.metrics import read_metrics
from tests.conftest import REPO, run_longboat, tiny_run_args

pytestmark = pytest.mark.slow

STEPS = ["train.steps=12", "checkpoint.every=4", "train.num_workers=2", "checkpoint.export=false"]


def losses(run_dir) -> dict[int, float]:
    """step -> loss; a resumed run logs some steps twice, and both must agree with the reference."""
    seen: dict[int, float] = {}
    for row in read_metrics(run_dir):
        if row["step"] in seen:
            assert seen[row["step"]] == row["loss"], f"step {row['step']} logged twice with different losses"
        seen[row["step"]] = row["loss"]
    return seen


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    run_longboat(*tiny_run_args(run_dir, corpus, *STEPS), check=True)
    ref = losses(run_dir)
    assert sorted(ref) == list(range(1, 13))
    return ref


def test_kill_while_writing_a_checkpoint(corpus, reference, tmp_path):
    killed = run_longboat(*tiny_run_args(tmp_path, corpus, *STEPS), env={FAULT_ENV: "8"})
    assert killed.returncode == -signal.SIGKILL
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["step_00000004", "step_00000008.tmp"]  # the interrupted save is left incomplete
    resumed = run_longboat(*tiny_run_args(tmp_path, corpus, *STEPS), check=True)
    assert "resumed from" in resumed.stdout and "step_00000004" in resumed.stdout
    assert losses(tmp_path) == reference  # bitwise: floats compared exactly
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_00000004", "step_00000008", "step_00000012"]  # the stale .tmp was cleared


def test_kill_between_steps(corpus, reference, tmp_path):
    cmd = [sys.executable, "-m", "longboat", *tiny_run_args(tmp_path, corpus, *STEPS)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if max((r["step"] for r in read_metrics(tmp_path)), default=0) >= 6:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = max(losses(tmp_path))
    assert 6 <= done < 12, "the run should have been killed mid-way"
    run_longboat(*tiny_run_args(tmp_path, corpus, *STEPS), check=True)
    assert losses(tmp_path) == reference
