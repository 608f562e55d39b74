"""The diffusion task: the data fills the model's shape, draws are keyed by sample position, training lowers the loss,
a resumed run equals a straight one bitwise, 2 gloo ranks equal one process, and bad input ends in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longboat.cli.main import main
from longboat.config.base import ConfigError
from longboat.recipes import train
from longboat.recipes.config import resolve
from longboat.tasks.diffusion import SPEC_FILE, DiffusionTask, min_snr_weight
from longboat.trainer.config import TrainerConfig
from longboat.trainer.metrics import read_metrics

MODEL = {"arch": "dit", "preset": "tiny", "hidden_size": 32, "depth": 2, "num_heads": 2}


def config(tmp_path: Path, steps: int = 6, model: dict | None = None, **data) -> dict:
    return {"task": "diffusion", "run_dir": str(tmp_path / "run"), "seed": 5, "model": {**MODEL, **(model or {})},
            "data": {"source": "digits", **data},
            "train": {"steps": steps, "micro_batch_size": 8, "num_workers": 0, "log_every": 1, "eval_batches": 2,
                      "tensorboard": False, "optimizer": {"lr": 3e-3},
                      "schedule": {"kind": "constant"}},  # a run stopped early follows the same rates
            "checkpoint": {"every": 0}}


def built(tmp_path, dp_size: int = 1, **data):
    resolved = resolve(config(tmp_path, **data))
    task_data = resolved.task.build(resolved.model, resolved.cfg.train, resolved.cfg.seed, dp_size)
    return resolved, task_data


def batch_of(dataset, positions):
    items = [dataset[(p % len(dataset), p)] for p in positions]
    return {k: torch.stack([item[k] for item in items]) for k in items[0]}


def test_the_data_fills_the_model_and_ema_is_on_by_default(tmp_path):
    resolved = resolve(config(tmp_path, model={"num_classes": None, "image_size": None}))
    assert (resolved.model.image_size, resolved.model.in_channels, resolved.model.num_classes) == (8, 1, 10)
    assert resolved.cfg.train.ema is not None and resolved.cfg.train.ema.decay == 0.999
    off = config(tmp_path)
    off["train"]["ema"] = None
    assert resolve(off).cfg.train.ema is None
    mine = config(tmp_path)
    mine["train"]["ema"] = {"decay": 0.9}
    assert resolve(mine).cfg.train.ema.decay == 0.9


@pytest.mark.parametrize("objective", [{"kind": "flow"}, {"kind": "flow", "time": "mode", "shift": 2.0},
                                       {"kind": "ddpm", "prediction": "v"}, {"kind": "ddpm"}])
def test_draws_are_keyed_by_position_whatever_the_batch(tmp_path, objective):
    resolved, data = built(tmp_path, objective=objective, cond_dropout=0.5, loss_weight="min_snr")
    model = resolved.spec.build(resolved.model).eval()
    torch.manual_seed(0)  # the global generator must not matter
    with torch.no_grad():
        whole = data.loss_fn(model, batch_of(data.train, range(8)))
        halves = [data.loss_fn(model, batch_of(data.train, range(i, i + 4))) for i in (0, 4)]
        torch.manual_seed(1)
        again = data.loss_fn(model, batch_of(data.train, range(8)))
    torch.testing.assert_close(whole.loss_sum, halves[0].loss_sum + halves[1].loss_sum, rtol=1e-5, atol=1e-6)
    assert torch.equal(whole.loss_sum, again.loss_sum) and whole.count == 8
    buckets = [k for k in whole.metrics if k.startswith("loss/t")]
    assert buckets == ["loss/t0.00-0.25", "loss/t0.25-0.50", "loss/t0.50-0.75", "loss/t0.75-1.00"]


def test_cond_dropout_sends_labels_to_the_null_class(tmp_path):
    seen = []

    class Spy(torch.nn.Module):
        def forward(self, x, t, labels):
            seen.append(labels.clone())
            return torch.zeros_like(x)

    _, data = built(tmp_path, cond_dropout=0.5, eval_buckets=0)
    batch = batch_of(data.train, range(64))
    data.loss_fn(Spy().train(), batch)
    dropped = seen[0] == 10
    assert 16 < int(dropped.sum()) < 48
    assert torch.equal(seen[0][~dropped], batch["label"][~dropped])
    _, kept = built(tmp_path, cond_dropout=0.0, eval_buckets=0)
    kept.loss_fn(Spy().train(), batch_of(kept.train, range(64)))
    assert not torch.any(seen[1] == 10)


def test_flow_times_follow_the_window_and_shift(tmp_path):
    times = []

    class Spy(torch.nn.Module):
        def forward(self, x, t, labels):
            times.append(t.clone())
            return torch.zeros_like(x)

    _, data = built(tmp_path, objective={"kind": "flow", "time": "uniform", "time_window": [0.2, 0.6]},
                    eval_buckets=0)
    data.loss_fn(Spy().train(), batch_of(data.train, range(256)))
    assert times[0].min() >= 0.2 and times[0].max() <= 0.6 and times[0].max() - times[0].min() > 0.3
    _, data = built(tmp_path, objective={"kind": "flow", "time": "uniform", "shift": 1.0, "shift_base_size": 2})
    data.loss_fn(Spy().train(), batch_of(data.train, range(256)))
    assert times[1].mean() > 0.7  # shift 4 (image_size 8 / base 2) moves times to the noisy end


def test_min_snr_weight_caps_the_clean_image_weight():
    snr = torch.tensor([0.5, 5.0, 50.0])
    torch.testing.assert_close(min_snr_weight(snr, 1 / snr, 5.0), torch.tensor([1.0, 1.0, 0.1]))


def test_the_spec_rides_in_checkpoint_state(tmp_path):
    resolved, _ = built(tmp_path)
    spec = json.loads(resolved.task.export_assets()[SPEC_FILE])
    assert spec["classes"] == [str(i) for i in range(10)] and spec["objective"]["kind"] == "flow"
    fresh = DiffusionTask(resolved.data)
    with pytest.raises(ConfigError, match="neither is at hand"):
        fresh.export_assets()
    fresh.load_state_dict(resolved.task.state_dict())
    assert fresh.export_assets() == resolved.task.export_assets()


@pytest.mark.slow
def test_a_run_lowers_the_loss_resumes_bitwise_and_exports(tmp_path):
    straight = config(tmp_path / "a", steps=60)
    result = train.run(resolve(straight))
    metrics = read_metrics(Path(straight["run_dir"]))
    first, last = sum(r["loss"] for r in metrics[:5]) / 5, sum(r["loss"] for r in metrics[-5:]) / 5
    assert last < 0.85 * first, (first, last)
    assert result.valid_loss is not None
    valid = [r for r in read_metrics(Path(straight["run_dir"]), "valid") if "loss/t0.75-1.00" in r]
    assert valid, "validation reports the loss per time bucket"
    interrupted = config(tmp_path / "b", steps=60)
    interrupted["train"]["steps"] = 30
    train.run(resolve(interrupted))
    interrupted["train"]["steps"] = 60
    train.run(resolve(interrupted))
    a = load_file(Path(straight["run_dir"]) / "export" / "model.safetensors")
    b = load_file(Path(interrupted["run_dir"]) / "export" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (Path(straight["run_dir"]) / "export" / SPEC_FILE).is_file()


@pytest.mark.slow
@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
def test_two_gloo_ranks_equal_one_process(tmp_path, data_parallel):
    from tests.distributed.conftest import train_on_two_ranks

    single = config(tmp_path / "one", steps=4)
    train.run(resolve(single))
    double = config(tmp_path / "two", steps=4)
    double["train"]["micro_batch_size"] = 4
    double["parallel"] = {"data_parallel": data_parallel}
    one, two = Path(single["run_dir"]), train_on_two_ranks(double, tmp_path)
    for key in ("loss", "mse"):
        ours = [r[key] for r in read_metrics(two) if key in r]
        theirs = [r[key] for r in read_metrics(one) if key in r]
        assert len(ours) == 4
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("override, message", [
    ("data.source=/nonexistent", "data.source: /nonexistent: no such folder or file"),
    ("model.image_size=16", "model.image_size=16 disagrees with the data"),
    ("model.arch=decoder", "task 'diffusion' trains an image generator, but the model config"),
    ("data.loss_weight=snr", "unknown loss weight 'snr'"),
    ("data.objective={kind: flow, time: logit_normal, time_params: {scale: 1}}",
     "time_params ['scale'] are not parameters of 'logit_normal'"),
    ("data.objective={kind: flow, time_window: [0.5, 0.2]}", "time_window must be [min, max]"),
    ("data.objective={kind: score}", "data.objective"),
    ("data.channels=2", "data.channels"),
])
def test_bad_input_fails_in_one_line(tmp_path, capsys, override, message):
    path = tmp_path / "diffusion.yaml"
    cfg = config(tmp_path)
    if override.startswith("model.arch"):
        cfg["model"] = {}
    path.write_text(json.dumps(cfg))
    code = main(["train", str(path), override, "--check"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_a_validation_split_smaller_than_a_micro_batch_is_refused(tmp_path):
    resolved = resolve(config(tmp_path, valid_fraction=0.002))
    with pytest.raises(ConfigError, match="fewer than one micro-batch"):
        resolved.task.build(resolved.model, TrainerConfig(steps=1, micro_batch_size=8), 0, 2)
