import os
import signal

import pytest
import torch

from longboat.tasks.lm_loss import make_lm_loss
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.trainer.metrics import read_metrics
from longboat.trainer.trainer import LossOutput, Trainer, TrainingError
from tests.trainer.conftest import RandomTokens, TokenHooks, small_model


def make_trainer(tmp_path, loss_fn=None, steps=6, mbs=4, accum=1, **kw):
    cfg = TrainerConfig(steps=steps, micro_batch_size=mbs, grad_accum=accum, log_every=1, eval_batches=2,
                        num_workers=0, tensorboard=False, optimizer={"lr": 1e-2}, **kw)
    return Trainer(cfg, CheckpointConfig(), tmp_path, small_model(), loss_fn or make_lm_loss(False),
                   RandomTokens(256, 16, 128), RandomTokens(16, 16, 128), flops_per_unit=1e5,
                   hooks=TokenHooks())


def test_loss_falls_and_metrics_are_logged(tmp_path):
    result = make_trainer(tmp_path, steps=30).fit()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_mem_mb"} <= rows[0].keys()
    valid = read_metrics(tmp_path, "valid")
    assert valid and valid[-1].keys() == {"kind", "step", "loss"}  # perplexity is the pretraining task's metric
    assert result.valid_loss == valid[-1]["loss"] and (tmp_path / "checkpoints").is_dir()


def test_accumulation_does_not_change_the_loss(tmp_path):
    """Normalising by the global item count makes 2x4 micro-batches equal to 1x8."""
    a = make_trainer(tmp_path / "a", steps=3, mbs=8, accum=1)
    b = make_trainer(tmp_path / "b", steps=3, mbs=4, accum=2)
    a.fit(), b.fit()
    la = [r["loss"] for r in read_metrics(tmp_path / "a")]
    lb = [r["loss"] for r in read_metrics(tmp_path / "b")]
    assert la == pytest.approx(lb, rel=1e-5)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_nonfinite_steps_are_skipped_then_stop_the_run(tmp_path):
    base = make_lm_loss(False)
    calls = {"n": 0}

    def flaky(model, batch):
        calls["n"] += 1
        out = base(model, batch)
        return LossOutput(out.loss_sum * float("nan"), out.count, out.units) if calls["n"] == 2 else out

    trainer = make_trainer(tmp_path / "skip", flaky, steps=4)
    result = trainer.fit()
    assert result.skipped_steps == 1 and result.step == 4
    assert [r["skipped"] for r in read_metrics(tmp_path / "skip")] == [0, 1, 0, 0]

    def always_nan(model, batch):
        out = base(model, batch)
        return LossOutput(out.loss_sum * float("inf"), out.count, out.units)

    with pytest.raises(TrainingError, match="not finite for 3 steps in a row"):
        make_trainer(tmp_path / "stop", always_nan, steps=10, max_consecutive_nonfinite=3).fit()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_saves_a_checkpoint_and_stops(tmp_path, sig, ctrl_c):
    """SIGTERM (preemption) and Ctrl-C stop after the current step with a checkpoint that resumes."""
    base = make_lm_loss(False)

    def loss_then_signal(model, batch):
        if trainer.step == 2:
            os.kill(os.getpid(), sig)
        return base(model, batch)

    trainer = make_trainer(tmp_path, loss_then_signal, steps=50)
    result = trainer.fit()
    assert result.stopped_by_signal and result.signal == sig and result.step == 3
    assert trainer.checkpoints.latest().name == "step_00000003"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # previous handlers restored
    resumed = make_trainer(tmp_path, steps=5)
    resumed.fit()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]


def test_a_second_ctrl_c_stops_at_once(tmp_path, ctrl_c):
    base = make_lm_loss(False)

    def loss_then_ctrl_c(model, batch):
        if trainer.step >= 2:
            os.kill(os.getpid(), signal.SIGINT)
        return base(model, batch)

    trainer = make_trainer(tmp_path, loss_then_ctrl_c, steps=20, accum=2)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert trainer.step == 2 and trainer.checkpoints.latest() is None  # stopped inside step 3, nothing half-saved


def test_weighted_metrics_are_means_over_their_items(tmp_path):
    """A loss whose metrics are per-item means over a varying number of items gives their weight: the step's (and the
    evaluation's) metric is then the mean over every item, not the mean of the micro-batches' means."""
    base = make_lm_loss(False)
    calls = {"n": 0}

    def per_item(model, batch):
        calls["n"] += 1
        items = 1 if calls["n"] % 2 else 3  # micro-batches of 1 and 3 items, with means 0 and 1
        out = base(model, batch)
        return LossOutput(out.loss_sum, out.count, out.units, {"hit": float(items == 3)}, metrics_weight=items)

    make_trainer(tmp_path, per_item, steps=2, accum=2).fit()
    assert [r["hit"] for r in read_metrics(tmp_path)] == [0.75, 0.75]  # 3 of 4 items, not (0 + 1) / 2
    assert read_metrics(tmp_path, "valid")[-1]["hit"] == 0.75
