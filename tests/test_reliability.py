"""Training never hangs on an error, never shares a run directory, and checks before it writes."""

import os
import re
import signal
import sys
import time

import pytest

from longboat.utils.run_lock import RunDirLock
from tests.conftest import run_longboat, tiny_run_args
from tests.distributed.conftest import finish, start
from tests.test_plugin_task import make_data, write_config

pytestmark = pytest.mark.slow


def test_an_error_with_loader_workers_exits_promptly(tmp_path):
    cfg = write_config(tmp_path, make_data(tmp_path / "d.safetensors"), num_workers=2)
    started = time.monotonic()
    proc = run_longboat("train", str(cfg), "data.fail_at_step=3", timeout=120)
    assert proc.returncode == 1 and "injected failure at step 3" in proc.stderr
    assert time.monotonic() - started < 60


def test_a_failing_rank_ends_the_job(tmp_path):
    cfg = write_config(tmp_path, make_data(tmp_path / "d.safetensors"), num_workers=1, micro_batch_size=8)
    log = tmp_path / "job.log"
    proc = start([sys.executable, "-m", "longboat", "train", str(cfg), "--nproc", "2", "data.fail_at_step=3",
                  "data.fail_on_rank=1", "parallel.data_parallel=ddp"], log)
    out = finish(proc, log, timeout=150)
    assert proc.returncode != 0 and "injected failure at step 3" in out


def test_ctrl_c_saves_a_checkpoint_that_resumes(corpus, tmp_path, ctrl_c):
    """Ctrl-C (SIGINT to the job's process group, as a terminal sends it) stops a run with loader workers after the
    current step, with a checkpoint, and exits 130; the rerun resumes from that checkpoint."""
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    proc = start([sys.executable, "-m", "longboat", *tiny_run_args(run_dir, corpus, "train.steps=5000",
                                                                    "train.num_workers=2")], log)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and \
            not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    out = finish(proc, log, timeout=120)
    assert proc.returncode == 130, out[-3000:]
    step = int(re.search(r"SIGINT: saving a checkpoint at step (\d+) and stopping", out).group(1))
    assert (run_dir / "checkpoints" / f"step_{step:08d}").is_dir()
    rerun = run_longboat(*tiny_run_args(run_dir, corpus, f"train.steps={step + 2}"), check=True)
    assert f"at step {step}" in rerun.stdout


def test_a_second_run_into_a_busy_directory_is_refused(tmp_path):
    cfg = write_config(tmp_path, make_data(tmp_path / "d.safetensors"))
    with RunDirLock(tmp_path / "run"):
        proc = run_longboat("train", str(cfg))
    assert proc.returncode == 2 and "is in use by pid" in proc.stderr and "Traceback" not in proc.stderr


def test_a_rerun_with_another_model_leaves_the_run_intact(corpus, tmp_path):
    run = tmp_path / "run"
    run_longboat(*tiny_run_args(run, corpus, "train.steps=2"), check=True)
    saved = (run / "config.yaml").read_text()
    proc = run_longboat(*tiny_run_args(run, corpus, "train.steps=4", "model.d_model=128", "model.n_heads=8"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "holds checkpoints (step_00000002) of another model" in proc.stderr
    assert "model.d_model 64 there, 128 here" in proc.stderr and "model.n_heads 4 there, 8 here" in proc.stderr
    assert (run / "config.yaml").read_text() == saved
    run_longboat("generate", str(run), "--prompt", "def ", "--max-new-tokens", "2", check=True)


def test_data_that_does_not_fit_the_model_fails_before_writing(corpus, tmp_path):
    run = tmp_path / "run"
    long = run_longboat(*tiny_run_args(run, corpus, "data.seq_len=256", "train.num_workers=2"))
    assert long.returncode == 2 and "data.seq_len=256 exceeds model.max_seq_len=128" in long.stderr
    wide = run_longboat(*tiny_run_args(run, corpus, "model.vocab_size=256", "data.tokenizer=" + str(tmp_path / "t")))
    assert wide.returncode == 2
    assert not run.exists()


def test_token_ids_beyond_the_vocabulary_are_found(corpus, tmp_path):
    import numpy as np

    from longboat.data.indexed import IndexedDataset, IndexedDatasetWriter
    from longboat.data.token_range import max_token_id

    tokenizer, prefix = corpus
    top = max_token_id(IndexedDataset(prefix), tmp_path)
    assert 0 < top < 512 and max_token_id(IndexedDataset(prefix), tmp_path) == top  # the second from the cache
    foreign = tmp_path / "foreign_text_document"  # written by another tokenizer: ids up to 999
    with IndexedDatasetWriter(foreign) as w:
        for doc in np.random.default_rng(0).integers(0, 1000, (200, 64)):
            w.add_document(doc)
    proc = run_longboat(*tiny_run_args(tmp_path / "run", (tokenizer, str(foreign))), "--check")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "foreign_text_document.bin holds token id 999, beyond the model's embedding (model.vocab_size=512)" \
        in proc.stderr


def test_check_validates_without_training(corpus, tmp_path):
    run = tmp_path / "run"
    ok = run_longboat(*tiny_run_args(run, corpus, "train.steps=2"), "--check", check=True)
    assert ok.stdout.startswith("ok: task pretrain · model decoder · 1 rank(s)") and "starts fresh" in ok.stdout
    assert not run.exists()
    two = run_longboat(*tiny_run_args(run, corpus, "parallel.tp=2"), "--check", "--nproc", "2", check=True)
    assert "dp_shard 1 × tp 2" in two.stdout
    three = run_longboat(*tiny_run_args(run, corpus), "--check", "--nproc", "2", "parallel.dp_shard=3")
    assert three.returncode == 2 and "= 3 ranks, but the job has 2" in three.stderr


def test_the_summary_reports_only_the_validation_it_will_run(corpus, tmp_path):
    proc = run_longboat(*tiny_run_args(tmp_path / "run", corpus, "data.split=1,0,0", "train.steps=1"), check=True)
    assert "valid_samples 0" in proc.stdout
