"""Context parallelism (Ulysses) on 2 gloo ranks equals one process for the tiny Wan video transformer: one forward's
output and gradients, and training by the real Trainer under FSDP2 over dp_shard × cp (with full activation
checkpointing, or compiled with selective checkpointing) and under DDP; its checkpoint resumes in one process.
Layouts it cannot serve are refused in one line. All 2-rank cases share one torchrun launch."""

from __future__ import annotations

import json

import pytest
import torch

from longboat.cli.main import main
from longboat.config.base import ConfigError, validate
from longboat.distributed import ParallelConfig
from longboat.models.diffusion import WAN_SPEC, WanConfig
from longboat.trainer.metrics import read_metrics
from tests.distributed.conftest import finish, free_ports, start, torchrun
from tests.distributed.cp_worker import MODEL, STEPS, parity_loss, run_case, tiny_wan

pytestmark = pytest.mark.slow

WORKER = "tests/distributed/cp_worker.py"
TRAINED = ["cp", "cp_ddp", "cp_compile"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp_runs")
    (port,) = free_ports(1)
    # As the other launches: compiled blocks traced by AOT autograd and run eagerly (the layout decides the graphs).
    env = {"TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:aot_eager"}
    two = start(torchrun(2, port, WORKER, str(out), "parity", *TRAINED), out / "two.log", env=env)
    threads = torch.get_num_threads()
    try:
        run_case(out, "single")  # the reference, while the ranks run
    finally:
        torch.set_num_threads(threads)
        log = finish(two, out / "two.log", timeout=300)
    assert two.returncode == 0, log[-6000:]
    run_case(out, "single_from_cp")
    return out


def test_output_and_gradients_equal_one_process(runs):
    got = torch.load(runs / "parity" / "result.pt", weights_only=True)
    model = tiny_wan()
    output, loss = parity_loss(model)
    loss.backward()
    assert (got["output"] - output.detach()).abs().max() <= 1e-5
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert got["grads"].keys() == grads.keys()
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name  # every weight sees the loss: the comparison means something
        assert (got["grads"][name] - grad).abs().max() <= 1e-5 * max(1.0, grad.abs().max().item()), name
    # FSDP2 shards every parameter over dp_shard × cp: here both ranks, each holding half of a block's weight.
    assert json.loads((runs / "parity" / "layout.json").read_text()) == {"local": [16, 24], "full": [32, 24],
                                                                          "mesh": 2}


@pytest.mark.parametrize("case", TRAINED)
def test_training_equals_one_process(runs, case):
    rows, reference = read_metrics(runs / case), read_metrics(runs / "single")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row, ref in zip(rows, reference):
        assert row["loss"] == pytest.approx(ref["loss"], rel=1e-5), f"loss at step {row['step']}"
        assert row["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5), f"grad norm at step {row['step']}"
    assert reference[-1]["loss"] < reference[0]["loss"]


def test_a_cp_checkpoint_resumes_in_one_process(runs):
    rows, reference = read_metrics(runs / "single_from_cp"), read_metrics(runs / "single")
    assert [r["step"] for r in rows] == [3, 4]
    for row, ref in zip(rows, reference[2:]):
        assert row["loss"] == pytest.approx(ref["loss"], rel=1e-5), f"loss at step {row['step']}"


def test_selective_checkpointing_keeps_the_exchanged_heads(runs):
    # Per block: queries, keys and values sent out and the output back, once forward and once backward; full
    # checkpointing sends them again to recompute, selective keeps what the all-to-alls received.
    counts = json.loads((runs / "parity" / "all_to_all.json").read_text())
    assert counts == {"none": {"forward": 8, "backward": 8}, "selective": {"forward": 8, "backward": 8},
                      "full": {"forward": 8, "backward": 16}}


def _one_line(fn, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)


def test_layouts_it_cannot_serve_are_refused_in_one_line(runs, tmp_path, capsys):
    for other in ("tp", "pp", "ep"):
        _one_line(lambda: validate(ParallelConfig, {"cp": 2, other: 2}),
                  rf"parallel.cp=2 cannot be combined with {other}=2")
    wan = WanConfig(**{**MODEL, "num_heads": 3})
    _one_line(lambda: WAN_SPEC.sequence_plan(wan, 2), r"parallel.cp=2 must divide model.num_heads \(3\)")
    assert WAN_SPEC.sequence_plan(WanConfig(**MODEL), 2) is not None
    # before the run: a model without a sequence plan
    cfg = {"task": "diffusion", "run_dir": str(tmp_path / "run"),
           "model": {"arch": "dit", "preset": "tiny", "hidden_size": 32, "depth": 2, "num_heads": 2},
           "data": {"source": "digits"}, "train": {"steps": 2, "micro_batch_size": 8}, "parallel": {"cp": 2}}
    path = tmp_path / "dit.yaml"
    path.write_text(json.dumps(cfg))
    assert main(["train", str(path), "--check", "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model 'dit' has no sequence-parallel plan; set parallel.cp=1" in err, err
    # at the split: a token count the ranks cannot share
    refusal = (runs / "parity" / "refusal.txt").read_text()
    assert refusal == ("parallel.cp=2 must divide the token count: blocks.0 (x) has 3 along dim 1 (shape [1, 3, 24]); "
                       "choose a frame count and size whose patch grid 2 divides")
