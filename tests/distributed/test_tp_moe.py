"""Mixture of experts and latent attention under tensor parallel, and combined layouts, on real gloo ranks.

A small DeepSeek-V3 (latent attention, a dense first layer, MoE with a shared expert), a small Qwen3-MoE and a small
Qwen2-MoE (a gated shared expert, capacity; also compiled) train with the real Trainer under TP 2 and FSDP 2 × TP 2,
every expert split over tp; on 8 ranks, a small dense decoder under HSDP (2 replicas × 2 shards) × TP 2 and the
Qwen3-MoE under pp 2 × ep 2 × tp 2. Each must follow one process's loss curve and end at its weights. A TP checkpoint
resumes under FSDP, and a run whose torchrun gets SIGTERM stops with one complete checkpoint, which resumes the
curve in one process.
"""

import json

import pytest
import torch

from longboat.checkpoint.dcp import COMPLETE_MARKER
from longboat.models import build_model
from tests.distributed.conftest import WorkerRuns, assert_bias_balancing_moved, last_step
from tests.distributed.test_parallelize import _assert_same_run
from tests.distributed.train_worker import CASES, MODELS, MOVED, SAVE_AT, STEPS

pytestmark = pytest.mark.slow

STOPPED = "stopped_tp_deepseek"
WORKER_RUNS = WorkerRuns(
    launches={8: ("hsdp_tp", "pp_ep_tp_qwen3moe"),
              4: ("fsdp_tp_deepseek", "fsdp_tp_qwen3moe"),
              2: ("tp_deepseek", "tp_qwen3moe", "tp_qwen2moe", "tp_compile_qwen2moe", "fsdp_from_tp_deepseek")},
    beside=("single", "single_deepseek", "single_qwen3moe", "single_qwen2moe", "single_qwen3moe_accum",
            "single_qwen3moe_accum_4"),
    after=("single_from_stopped",),
    stop=STOPPED,  # run last in the 2-rank launch, whose torchrun gets SIGTERM mid-run
)


@pytest.fixture
def runs(worker_runs):
    return worker_runs


# The one-process reference of each case. Each data-parallel rank computes the aux loss of its own micro-batch: the
# DeepSeek sequence-wise loss is a mean over sequences, which splitting the batch leaves unchanged, the Switch loss
# of Qwen3-MoE is not, so its reference accumulates the same two halves.
REFERENCES = {
    "tp_deepseek": "single_deepseek",
    "tp_qwen3moe": "single_qwen3moe",
    "tp_qwen2moe": "single_qwen2moe",  # a gated shared expert, and capacity dropping copies
    "tp_compile_qwen2moe": "single_qwen2moe",  # compiled around the split experts, selective checkpointing
    "fsdp_tp_deepseek": "single_deepseek",
    "fsdp_tp_qwen3moe": "single_qwen3moe_accum",
    "hsdp_tp": "single",  # the combined layout, on the smallest (dense) model
    "pp_ep_tp_qwen3moe": "single_qwen3moe_accum_4",  # pp 2 × ep 2 × tp 2: 2 data-parallel ranks × 2 micro-batches
}


@pytest.mark.parametrize("case", list(REFERENCES))
def test_tensor_parallel_layouts_match_one_process(runs, case):
    """Equal losses, gradient norms and weights: the split experts' partial sums add up, replicated routers, gates
    and latents get their gradient once, not tp times, and the aux losses and load counts (which steer the expert
    bias) are counted once."""
    model, ref = CASES[case].model, REFERENCES[case]
    _assert_same_run(runs, case, ref)
    first = torch.load(runs / ref / "final.pt", weights_only=True)
    torch.manual_seed(0)  # as train_worker.run_case
    init = build_model("decoder", MODELS[model]).state_dict()
    assert max((first[k] - init[k]).abs().max().item() for k in first) > MOVED  # the weights really moved
    if model == "deepseek":
        assert_bias_balancing_moved(runs / ref)


def test_pipeline_expert_and_tensor_parallel_split_each_stage_s_experts(runs):
    """Rank 0 (first stage) holds half of its layer's experts, and half of each one's ffn units."""
    layout = json.loads((runs / "pp_ep_tp_qwen3moe" / "layout.json").read_text())
    moe = MODELS["qwen3moe"]["moe"]
    assert layout["layers.0.feed_forward.experts.w13"]["shape"] == [moe["n_experts"] // 2, 2,
                                                                    moe["expert_ffn_dim"] // 2, moe["d_model"]]
    assert not any(name.startswith("layers.1.") for name in layout)  # the second stage's layer lives elsewhere


@pytest.mark.parametrize("case", ["tp_deepseek", "tp_qwen2moe"])
def test_tensor_parallel_splits_every_expert(runs, case):
    """Each tp rank holds half of every expert's ffn units (routed and shared), not a replica; the router and the
    shared expert's gate stay whole."""
    layout = json.loads((runs / case / "layout.json").read_text())
    moe = MODELS[CASES[case].model]["moe"]
    d, n_exp, ffn = moe["d_model"], moe["n_experts"], moe["expert_ffn_dim"]
    layer = "layers.1.feed_forward"
    assert layout[f"{layer}.experts.w13"]["shape"] == [n_exp, 2, ffn // 2, d]  # gate and up rows, halved
    assert layout[f"{layer}.experts.w2"]["shape"] == [n_exp, d, ffn // 2]
    assert layout[f"{layer}.router.weight"]["shape"] == [n_exp, d]
    if moe.get("n_shared_experts"):
        shared = moe.get("shared_ffn_dim", ffn) * moe["n_shared_experts"]
        assert layout[f"{layer}.shared_experts.w1.weight"]["shape"] == [shared // 2, d]
        assert layout[f"{layer}.shared_experts.w2.weight"]["shape"] == [d, shared // 2]
    if moe.get("shared_expert_gate"):
        assert layout[f"{layer}.shared_gate.weight"]["shape"] == [1, d]


def test_tensor_parallel_checkpoint_resumes_under_fsdp(runs):
    _assert_same_run(runs, "fsdp_from_tp_deepseek", "single_deepseek", first_step=SAVE_AT + 1)


def test_sigterm_to_torchrun_saves_one_checkpoint_that_resumes(runs):
    """The ranks finish their step, agree to stop, write one complete checkpoint and exit; one process resumes it
    and follows the uninterrupted curve."""
    checkpoints = runs / STOPPED / "checkpoints"
    saved = sorted(p.name for p in checkpoints.iterdir())
    assert len(saved) == 1 and (checkpoints / saved[0] / COMPLETE_MARKER).is_file(), saved
    step = int(saved[0].removeprefix("step_"))
    assert CASES[STOPPED].slow_from <= step < STEPS, "the run should have stopped mid-way"
    assert last_step(runs / STOPPED) == step  # nothing trained past the checkpoint
    assert f"saving a checkpoint at step {step} and stopping" in (runs / "two.log").read_text()
    _assert_same_run(runs, "single_from_stopped", "single_deepseek", first_step=step + 1)
