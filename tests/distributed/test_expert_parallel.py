"""Expert parallel against one process: Qwen3-MoE- and DeepSeek-V3-style decoders trained with the real Trainer
on gloo ranks (ep 2, also compiled; ep 2 × FSDP 2; ep 2 × HSDP; ep 2 × tp 2, also compiled) follow the single-process losses and gradient
norms, end at its weights and expert biases, and compute its gradients; a checkpoint saved under ep 2 resumes in
one process. The Switch aux loss is per micro-batch, so the Qwen3-MoE reference accumulates two half batches, as
test_tp_moe.py does."""

import json

import pytest
import torch

from longboat.config.base import ConfigError, validate
from longboat.distributed import ParallelConfig, ParallelDims, resolve_dims
from longboat.distributed.parallelize import parallelize
from longboat.models.moe.expert_parallel import expert_major_order
from longboat.distributed.layout_checks import check_expert_parallel, expert_modules
from longboat.distributed.parallelize import apply_activation_checkpointing, apply_compile
from longboat.models import build_model
from longboat.recipes.config import load_run_config
from longboat.recipes.preflight import preflight
from tests.distributed.conftest import REPO, WorkerRuns, assert_bias_balancing_moved
from tests.distributed.test_parallelize import _assert_same_run
from tests.distributed.train_worker import CASES, MODELS, SAVE_AT


# ---- pure parts ----------------------------------------------------------------------------------------------
def test_received_rows_are_regrouped_expert_major_in_source_order():
    # Rank s sent received[s, e] rows for local expert e; rows arrive source-major.
    received = torch.tensor([[2, 0, 1], [1, 3, 0]])
    labels = [(s, e, i) for s in range(2) for e in range(3) for i in range(int(received[s, e]))]
    order = expert_major_order(received)
    assert [labels[i] for i in order] == sorted(labels, key=lambda t: (t[1], t[0], t[2]))
    assert expert_major_order(torch.zeros(2, 3, dtype=torch.long)).numel() == 0


def test_expert_parallel_degree_is_checked_before_any_collective():
    assert resolve_dims(ParallelConfig(ep=2), 4) == ParallelDims(1, 4, 1, ep=2)
    with pytest.raises(ConfigError, match=r"parallel.ep=4 must divide parallel.dp_shard=2"):
        resolve_dims(ParallelConfig(ep=4, dp_replicate=2), 4)
    with pytest.raises(ConfigError, match="parallel.ep=2 needs parallel.data_parallel=fsdp"):
        validate(ParallelConfig, {"ep": 2, "data_parallel": "ddp"})
    assert resolve_dims(validate(ParallelConfig, {"ep": 2, "tp": 2}), 4) == ParallelDims(1, 2, 2, ep=2)
    with pytest.raises(ConfigError, match=r"parallel.ep=8 must divide the model's n_experts \(4\)"):
        check_expert_parallel(build_model("decoder", MODELS["qwen3moe"]), 8)
    with pytest.raises(ConfigError, match="parallel.ep=2 needs a mixture-of-experts model"):
        parallelize(build_model("decoder", MODELS["tied"]), None, ParallelConfig(ep=2))


def test_compile_leaves_the_experts_and_their_dispatch_eager():
    model = build_model("decoder", MODELS["deepseek"])
    apply_activation_checkpointing(model, ["layers"], "full", 1)
    apply_compile(model, ["layers"], eager=expert_modules(model))
    compiled = {name for name, m in model.named_modules() if m._compiled_call_impl is not None}
    assert compiled == {
        "layers.0",  # the dense first layer: one graph, checkpoint included
        "layers.1._checkpoint_wrapped_module.attention",
        "layers.1._checkpoint_wrapped_module.feed_forward.router",
        "layers.1._checkpoint_wrapped_module.feed_forward.shared_experts",
    }


def test_a_run_checks_its_experts_split_before_it_starts():
    moe = "model.moe={d_model: 256, n_experts: 4, top_k: 2, expert_ffn_dim: 64}"
    run = load_run_config(REPO / "configs/pretrain/quickstart.yaml", ["parallel.ep=8", moe], from_data=False)
    with pytest.raises(ConfigError, match=r"parallel.ep=8 must divide the model's n_experts \(4\)"):
        preflight(run, 8)
    odd = "model.moe={d_model: 256, n_experts: 4, top_k: 2, expert_ffn_dim: 63}"
    run = load_run_config(REPO / "configs/pretrain/quickstart.yaml", ["parallel.ep=2", "parallel.tp=2", odd],
                          from_data=False)
    with pytest.raises(ConfigError, match=r"parallel.tp=2 must divide moe.expert_ffn_dim \(63\)"):
        preflight(run, 4)


# ---- real ranks ----------------------------------------------------------------------------------------------
WORKER_RUNS = WorkerRuns(
    launches={4: ("ep_fsdp_deepseek", "ep_fsdp_qwen3moe", "ep_hsdp_deepseek", "ep_tp_deepseek", "ep_tp_compile_qwen3moe"),
              2: ("ep_deepseek", "ep_qwen3moe", "fsdp_capacity", "ep_capacity", "ep_compile_qwen3moe")},
    beside=("single_deepseek", "single_qwen3moe_accum"),  # both write their first gradients
    after=("single_from_ep_deepseek",),
)


@pytest.fixture
def runs(worker_runs):
    return worker_runs


def _assert_same_gradients(runs, case: str, ref: str):
    got = torch.load(runs / case / "grads.pt", weights_only=True)
    want = torch.load(runs / ref / "grads.pt", weights_only=True)
    assert got.keys() == want.keys()
    assert any("experts.w" in name for name in got)
    for name, g in got.items():
        torch.testing.assert_close(g, want[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{case} {name}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("case,ref", [
    ("ep_qwen3moe", "single_qwen3moe_accum"),
    ("ep_deepseek", "single_deepseek"),
    ("ep_fsdp_deepseek", "single_deepseek"),
    ("ep_compile_qwen3moe", "single_qwen3moe_accum"),
    ("ep_tp_deepseek", "single_deepseek"),
    ("ep_tp_compile_qwen3moe", "single_qwen3moe_accum"),
])
def test_expert_parallel_training_matches_one_process(runs, case, ref):
    _assert_same_run(runs, case, ref)
    _assert_same_gradients(runs, case, ref)
    if "deepseek" in ref:
        assert_bias_balancing_moved(runs / ref)


@pytest.mark.slow
@pytest.mark.parametrize("case,ref", [
    ("ep_fsdp_qwen3moe", "single_qwen3moe_accum"),
    ("ep_hsdp_deepseek", "single_deepseek"),
    ("ep_capacity", "fsdp_capacity"),
])
def test_expert_parallel_gradients_match(runs, case, ref):
    _assert_same_gradients(runs, case, ref)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ep_tp_deepseek", "ep_tp_compile_qwen3moe"])
def test_expert_and_tensor_parallel_split_each_expert_both_ways(runs, case):
    """Under ep 2 × tp 2 a rank holds half of the experts, and half of each one's ffn units."""
    layout = json.loads((runs / case / "layout.json").read_text())
    moe = MODELS[CASES[case].model]["moe"]
    d, n_exp, ffn = moe["d_model"], moe["n_experts"], moe["expert_ffn_dim"]
    assert layout["layers.1.feed_forward.experts.w13"]["shape"] == [n_exp // 2, 2, ffn // 2, d]
    assert layout["layers.1.feed_forward.experts.w2"]["shape"] == [n_exp // 2, d, ffn // 2]


@pytest.mark.slow
def test_a_checkpoint_saved_under_expert_parallel_resumes_in_one_process(runs):
    _assert_same_run(runs, "single_from_ep_deepseek", "single_deepseek", first_step=SAVE_AT + 1)
