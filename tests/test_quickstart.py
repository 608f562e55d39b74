"""The README's main command, shortened: corpus → tokenizer → token files → training → sample."""

import pytest

from tests.conftest import run_longboat

pytestmark = pytest.mark.slow


def test_quickstart_runs_end_to_end(tmp_path):
    proc = run_longboat(
        "quickstart", "--run-dir", str(tmp_path / "run"), "--steps", "6",
        "train.eval_every=0", "train.eval_batches=2", "checkpoint.every=3", "train.log_every=3",
        env={"LONGBOAT_CACHE": str(tmp_path / "cache")}, check=True, timeout=600,
    )
    out = proc.stdout
    assert "unigram entropy" in out and "held-out loss" in out
    assert (tmp_path / "run" / "export" / "model.safetensors").is_file()
    assert (tmp_path / "quickstart_data" / "tokenizer" / "tokenizer.json").is_file()
    sample = out.split("longboat generate", 1)[1].split("\n", 1)[1]
    assert len(sample.strip()) > len("ROMEO.")  # a prompt plus a generated continuation
