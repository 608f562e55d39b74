"""A task and a model from outside the package (``tests/plugins/toy_policy.py``), trained through the real
command line: sizes from the data, normalisation statistics as checkpoint state and export asset, EMA, a frozen
stem, epochs over a finite dataset, DDP and FSDP2 on 2 gloo ranks, bitwise resume after SIGKILL, and
``open_artifact`` returning the EMA weights."""

import json
import re
import signal
import sys

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml
from safetensors.torch import load_file, save_file

from longboat.checkpoint.dcp import FAULT_ENV
from longboat.recipes.artifact import open_artifact
from longboat.trainer.metrics import read_metrics
from tests.conftest import REPO, run_longboat
from tests.distributed.conftest import finish, start

pytestmark = pytest.mark.slow

PLUGIN = REPO / "tests" / "plugins" / "toy_policy.py"
N, STATE, ACTION = 240, 5, 3
STEPS, BATCH = 40, 16  # 216 training samples: 13 global batches an epoch, so 40 steps are three epochs and more


def make_data(path, n=N):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    state = rng.normal(size=(n, STATE)).astype(np.float32)
    mix = rng.normal(size=(STATE, ACTION)).astype(np.float32)
    action = state @ mix + image.reshape(n, 3, -1).mean(-1)[:, :ACTION].astype(np.float32) / 64
    save_file({"image": torch.from_numpy(image), "state": torch.from_numpy(state),
               "action": torch.from_numpy(action)}, str(path))
    return path


def write_config(tmp_path, data, **train):
    cfg = {
        "task": "toy_policy", "run_dir": str(tmp_path / "run"), "plugins": [str(PLUGIN)],
        "model": {"arch": "toy_policy", "channels": 4}, "data": {"path": str(data)},
        "train": {"steps": STEPS, "micro_batch_size": BATCH, "log_every": 1, "eval_every": 8, "eval_batches": 2,
                  "num_workers": 0, "threads": 1, "tensorboard": False, "optimizer": {"lr": 3e-3},
                  "schedule": {"kind": "constant"}, "ema": {"decay": 0.9, "warmup_steps": 2}, **train},
        "checkpoint": {"every": 8},
    }
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def ema_model(checkpoint):
    """The model with the checkpoint's EMA weights (and its saved weights where the EMA has none: the stem)."""
    artifact = open_artifact(checkpoint.parent.parent)  # the run directory: its config's plugin registers the model
    model = artifact.spec.build(artifact.config)
    state = model.state_dict()
    dcp.load({"train": {"model": state}}, checkpoint_id=checkpoint)
    ema = {k: v.clone() for k, v in state.items() if not k.startswith("stem.")}
    dcp.load({"ema": ema}, checkpoint_id=checkpoint)
    model.load_state_dict({**state, **ema})
    return model.eval()


def outputs(model):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        return model(torch.rand(4, 3, 32, 32, generator=g), torch.randn(4, STATE, generator=g))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("toy")
    data = make_data(tmp / "toy.safetensors")
    proc = run_longboat("train", str(write_config(tmp, data)), check=True)
    return tmp, data, proc


def test_trains_in_epochs_with_sizes_from_the_data(reference):
    tmp, _, proc = reference
    run = tmp / "run"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"] == {"arch": "toy_policy", "image_size": 32, "state_dim": STATE, "action_dim": ACTION,
                              "channels": 4, "hidden": 64}
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[12]["epoch"] == pytest.approx(1.0) and rows[-1]["epoch"] == pytest.approx(STEPS / 13)
    assert "samples_per_s" in rows[0] and "tokens_per_s" not in rows[0] and "mfu" not in rows[0]
    assert sum(r["loss"] for r in rows[-4:]) < sum(r["loss"] for r in rows[:4])
    valid = read_metrics(run, "valid")
    assert [v["step"] for v in valid] == [8, 16, 24, 32, 40] and all(v["action_l1"] > 0 for v in valid)
    assert re.search(r"parameters \([\d.]+[KMB]? trainable, [\d.]+[KMB]? frozen\)", proc.stdout), proc.stdout
    # The stem is frozen: equal in every checkpoint; the rest moves.
    models = [ema_model(p) for p in sorted((run / "checkpoints").iterdir())]
    assert len(models) == 3
    assert torch.equal(models[0].stem[0].weight, models[-1].stem[0].weight)
    assert not torch.equal(models[0].head[0].weight, models[-1].head[0].weight)


def test_export_carries_statistics_and_ema_weights(reference):
    tmp, _, _ = reference
    run = tmp / "run"
    meta = json.loads((run / "export" / "longboat_config.json").read_text())
    assert meta["task"] == "toy_policy" and meta["ema"] is True and meta["plugins"] == [str(PLUGIN)]
    stats = json.loads((run / "export" / "normalization.json").read_text())
    assert set(stats) == {"state_mean", "state_std", "action_mean", "action_std"} and len(stats["action_std"]) == ACTION
    expected = outputs(ema_model(run / "checkpoints" / f"step_{STEPS:08d}"))
    # The run first: opening it imports its plugin, which the export alone would not.
    for source in (run, run / "export", run / "checkpoints" / f"step_{STEPS:08d}"):
        artifact = open_artifact(source)
        assert artifact.ema and artifact.task == "toy_policy"
        torch.testing.assert_close(outputs(artifact.model), expected, rtol=0, atol=0)
        asset = artifact.assets["normalization.json"]
        assert json.loads(asset if isinstance(asset, bytes) else asset.read_bytes()) == stats
    # `longboat export` of a checkpoint carries the same weights and statistics.
    run_longboat("export", str(run / "checkpoints" / "step_00000032"), "--output", str(tmp / "e32"), check=True)
    e32 = open_artifact(tmp / "e32")
    torch.testing.assert_close(outputs(e32.model), outputs(ema_model(run / "checkpoints" / "step_00000032")))
    assert json.loads((tmp / "e32" / "normalization.json").read_text()) == stats


def test_bad_data_config_and_too_little_data_fail_in_one_line(reference, tmp_path):
    _, data, _ = reference
    cfg = write_config(tmp_path, data)
    typo = run_longboat("train", str(cfg), "data.pth=x")
    assert typo.returncode == 2 and "Traceback" not in typo.stderr
    assert "unknown key 'data.pth'; did you mean 'path'" in typo.stderr
    small = write_config(tmp_path, make_data(tmp_path / "small.safetensors", n=12))
    short = run_longboat("train", str(small))
    assert short.returncode == 2 and "Traceback" not in short.stderr
    assert "the training data holds 11 samples, fewer than one global batch of 16" in short.stderr
    wrong = run_longboat("train", str(cfg), "model.state_dim=4")
    assert wrong.returncode == 2 and "model.state_dim=4 disagrees with the data" in wrong.stderr
    missing = run_longboat("train", str(cfg), f"plugins=[{tmp_path / 'nope.py'}]")
    assert missing.returncode == 2 and "plugin" in missing.stderr and "nope.py" in missing.stderr


def test_resumes_bitwise_after_sigkill_ema_included(reference, tmp_path):
    ref_tmp, data, _ = reference
    cfg = write_config(tmp_path, data)
    killed = run_longboat("train", str(cfg), env={FAULT_ENV: "16"})
    assert killed.returncode == -signal.SIGKILL
    run_longboat("train", str(cfg), check=True)
    ref, resumed = ref_tmp / "run", tmp_path / "run"
    losses = {r["step"]: r["loss"] for r in read_metrics(resumed)}
    assert losses == {r["step"]: r["loss"] for r in read_metrics(ref)}
    assert read_metrics(resumed, "valid")[-1] == read_metrics(ref, "valid")[-1]
    a, b = load_file(str(ref / "export" / "model.safetensors")), load_file(str(resumed / "export" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_two_ranks_follow_the_single_process(reference, tmp_path, layout):
    ref_tmp, data, _ = reference
    cfg = write_config(tmp_path, data, micro_batch_size=BATCH // 2)
    log = tmp_path / "train.log"
    proc = start([sys.executable, "-m", "longboat", "train", "--nproc", "2", str(cfg),
                  f"parallel.data_parallel={layout}"], log)
    out = finish(proc, log, timeout=300)
    assert proc.returncode == 0, out[-4000:]
    ours = [r["loss"] for r in read_metrics(tmp_path / "run")]
    single = [r["loss"] for r in read_metrics(ref_tmp / "run")]
    assert ours == pytest.approx(single, rel=1e-4, abs=1e-6)
    torch.testing.assert_close(outputs(open_artifact(tmp_path / "run").model),
                               outputs(open_artifact(ref_tmp / "run").model), rtol=1e-4, atol=1e-5)
