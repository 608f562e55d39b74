"""parallelize() against the plain model: in one process (checkpointing, meta init) and on real gloo ranks.

The multi-rank runs train the same tiny Decoder with the real Trainer on the same global batch as a single
process, and must follow its loss curve and end at its weights, for DDP, FSDP2, HSDP, TP+SP and FSDP×TP, and
when a checkpoint is resumed on another world size or another kind of data parallelism.
"""

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from longboat.config.base import ConfigError
from longboat.distributed import ParallelConfig
from longboat.distributed.parallelize import parallelize, plan_entry_matches
from longboat.models import build_model
from longboat.models.llm.parallel_plan import tensor_parallel_plan
from longboat.trainer.metrics import read_metrics
from tests.distributed.conftest import WorkerRuns
from tests.distributed.train_worker import CASES, MODELS, MOVED, SAVE_AT, STEPS

MODEL = dict(MODELS["untied_qk"])


def _loss_and_grads(model, tokens):
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode,every", [("full", 1), ("selective", 1), ("full", 2)])
def test_activation_checkpointing_keeps_names_and_gradients(mode, every):
    torch.manual_seed(0)
    plain = build_model("decoder", MODEL)
    wrapped = build_model("decoder", MODEL)
    wrapped.load_state_dict(plain.state_dict())
    wrapped = parallelize(wrapped, None, ParallelConfig(activation_checkpointing=mode, ac_every=every))
    assert wrapped.state_dict().keys() == plain.state_dict().keys()  # checkpoints and exports keep their names
    tokens = torch.randint(0, MODEL["vocab_size"], (2, 17))
    loss, grads = _loss_and_grads(plain, tokens)
    loss_w, grads_w = _loss_and_grads(wrapped, tokens)
    torch.testing.assert_close(loss_w, loss)
    assert {n.replace("_checkpoint_wrapped_module.", "") for n in grads_w} == grads.keys()
    for name, g in grads_w.items():
        torch.testing.assert_close(g, grads[name.replace("_checkpoint_wrapped_module.", "")])


def test_selective_checkpointing_keeps_every_matmul_and_redoes_the_rest():
    """Backward recomputes the pointwise ops of a block but no matrix product, the experts' grouped ones included."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    def backward_ops(mode: str) -> Counter:
        torch.manual_seed(0)
        model = parallelize(build_model("decoder", MODELS["qwen3moe"]), None,
                            ParallelConfig(activation_checkpointing=mode))
        logits = model(torch.randint(0, MODELS["qwen3moe"]["vocab_size"], (1, 16)))
        with Count() as count:
            logits.float().pow(2).mean().backward()
        return count.ops

    none, selective = backward_ops("none"), backward_ops("selective")
    redone = selective - none
    assert redone["silu"] > 0  # pointwise ops are recomputed...
    for op in ("mm", "addmm", "bmm", "_grouped_mm"):
        assert redone[op] == 0, f"{op} recomputed in backward"  # ...the matrix products are not
    assert none["_grouped_mm"] > 0  # the model does route through grouped matmuls


def test_meta_init_allocates_and_initialises():
    with torch.device("meta"):
        model = build_model("decoder", MODEL)
    model = parallelize(model, None, ParallelConfig(meta_init=True))
    reference = build_model("decoder", MODEL)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.device.type == "cpu" and torch.isfinite(p).all(), name
        assert p.std().item() == pytest.approx(q.std().item(), rel=0.5, abs=1e-6), name
    torch.testing.assert_close(model.rope_cos, reference.rope_cos)


def test_bf16_parameters_need_fsdp():
    with pytest.raises(ConfigError, match="param_dtype=bf16 is applied by FSDP"):
        parallelize(build_model("decoder", MODEL), None, ParallelConfig(param_dtype="bf16"))


@pytest.mark.parametrize("config", [
    dict(MODEL, tie_embeddings=True),
    dict(MODEL, tie_embeddings=False, qk_norm=True),
    MODELS["deepseek"],
    dict(MODELS["deepseek"], q_lora_rank=None, dense_layers=[]),
    MODELS["qwen3moe"],
    dict(MODELS["qwen3moe"], dense_layers=[1], moe=dict(MODELS["qwen3moe"]["moe"], n_shared_experts=2)),
])
def test_every_plan_entry_names_a_module(config):
    model = build_model("decoder", config)
    names = [name for name, _ in model.named_modules()]
    for pattern in tensor_parallel_plan(model.cfg):
        assert any(plan_entry_matches(name, pattern) for name in names), pattern


# ---- real ranks --------------------------------------------------------------------------------------------
def _rows(run_dir) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run_dir)}


WORKER_RUNS = WorkerRuns(
    launches={4: ("hsdp", "fsdp_tp"),
              2: ("fsdp", "ddp", "tp", "ddp_from_fsdp", "fsdp_from_single", "ddp_accum", "fsdp_accum")},
    beside=("single", "single_qk"),
    after=("single_from_fsdp",),
)


@pytest.fixture
def runs(worker_runs):
    return worker_runs


def _assert_same_run(runs, case: str, ref: str, first_step: int = 1, norm_rel: float = 1e-4):
    got, want = _rows(runs / case), _rows(runs / ref)
    assert sorted(got) == list(range(first_step, STEPS + 1))
    for step, row in got.items():
        assert row["loss"] == pytest.approx(want[step]["loss"], rel=1e-5), f"{case}: loss at step {step}"
        # The norm before clipping catches a wrongly scaled gradient, which Adam alone would hide.
        assert row["grad_norm"] == pytest.approx(want[step]["grad_norm"], rel=norm_rel), f"{case}: grad norm, step {step}"
    params = torch.load(runs / case / "final.pt", weights_only=True)
    expected = torch.load(runs / ref / "final.pt", weights_only=True)
    assert params.keys() == expected.keys()
    for name, value in params.items():
        torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=5e-5, msg=lambda m: f"{case} {name}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ddp", "fsdp", "hsdp", "tp", "fsdp_tp", "ddp_accum", "fsdp_accum"])
def test_parallel_training_matches_one_process(runs, case):
    ref = "single_qk" if CASES[case].model == "untied_qk" else "single"
    _assert_same_run(runs, case, ref)
    first = torch.load(runs / ref / "final.pt", weights_only=True)
    torch.manual_seed(0)  # as train_worker.run_case
    init = build_model("decoder", MODELS[CASES[case].model]).state_dict()
    assert max((first[k] - init[k]).abs().max().item() for k in first) > MOVED  # the weights really moved


@pytest.mark.slow
@pytest.mark.parametrize("case", ["single_from_fsdp", "ddp_from_fsdp", "fsdp_from_single"])
def test_resume_on_another_layout_continues_the_curve(runs, case):
    """2-rank FSDP → 1 process, 2-rank FSDP → 2-rank DDP, 1 process → 2-rank FSDP, from step SAVE_AT."""
    _assert_same_run(runs, case, "single", first_step=SAVE_AT + 1)


@pytest.mark.slow
def test_steps_and_gathers_run_no_sequential_collectives_worth_a_warning(runs):
    """DTensor warns, on every rank, when one redistribution takes several collectives. The gradient norm is one
    all-reduce whatever the layout; gathering FSDP × TP weights for an export takes two all-gathers that torch
    cannot merge, which the export does not warn about."""
    logs = sorted(runs.glob("*.log"))
    assert logs
    for log in logs:
        assert "sequential" not in log.read_text(), log.name
