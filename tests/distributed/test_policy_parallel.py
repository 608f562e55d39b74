"""Every policy architecture trained by the policy task under DDP and FSDP2 (with activation checkpointing) on 2
gloo ranks equals one process: losses, the validation action error (``predict`` under FSDP2) and final weights.
All cases share one torchrun launch."""

from __future__ import annotations

import pytest
import torch

from longboat.trainer.metrics import read_metrics
from tests.distributed.conftest import finish, free_ports, start, torchrun
from tests.distributed.policy_worker import ARCHS, LAYOUTS, NOISY_LOSS, STEPS, run_case
from tests.tasks.policy_dataset import write_policy_dataset

pytestmark = pytest.mark.slow

WORKER = "tests/distributed/policy_worker.py"
PARALLEL = [layout for layout in LAYOUTS if layout != "single"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("policy_runs")
    dataset = str(write_policy_dataset(out / "ds"))
    (port,) = free_ports(1)
    cases = [f"{arch}:{layout}" for arch in ARCHS for layout in PARALLEL]
    two = start(torchrun(2, port, WORKER, str(out), dataset, *cases), out / "two.log")
    threads = torch.get_num_threads()
    try:
        for arch in ARCHS:  # the references, while the ranks run
            run_case(out, dataset, f"{arch}:single")
    finally:
        torch.set_num_threads(threads)
        log = finish(two, out / "two.log", timeout=400)
    assert two.returncode == 0, log[-6000:]
    return out


@pytest.mark.parametrize("layout", PARALLEL)
@pytest.mark.parametrize("arch", list(ARCHS))
def test_policy_trains_on_two_ranks_as_in_one_process(runs, arch, layout):
    got, want = runs / f"{arch}_{layout}", runs / f"{arch}_single"
    losses, expected = read_metrics(got), read_metrics(want)
    assert [r["step"] for r in losses] == list(range(1, STEPS + 1))
    for row, ref in zip(losses, expected):
        assert row["loss"] == pytest.approx(ref["loss"], rel=1e-5), f"loss at step {row['step']}"
        assert row["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4), f"grad norm at step {row['step']}"
    if arch not in NOISY_LOSS:
        assert expected[-1]["loss"] < 0.8 * expected[0]["loss"]  # it learns
    valid, valid_ref = read_metrics(got, "valid")[-1], read_metrics(want, "valid")[-1]
    assert {k for k in valid_ref if k.startswith("action_mae")} >= {"action_mae", "action_mae/dx"}
    for key, value in valid_ref.items():
        if key not in ("step", "kind"):
            assert valid[key] == pytest.approx(value, rel=1e-4), key
    params = torch.load(got / "final.pt", weights_only=True)
    reference = torch.load(want / "final.pt", weights_only=True)
    assert params.keys() == reference.keys()
    for name, value in params.items():
        torch.testing.assert_close(value, reference[name], rtol=1e-4, atol=5e-5, msg=lambda m: f"{name}: {m}")
