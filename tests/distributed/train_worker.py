"""Train a tiny Decoder with the real Trainer, under torchrun or in one process, for the distributed tests.

    torchrun --nproc_per_node=2 tests/distributed/train_worker.py OUT CASE [CASE ...]

Cases run one after another in the same process group. Each writes ``OUT/<case>/metrics.jsonl``, its
checkpoints and ``final.pt`` (the full parameters, gathered to rank 0); cases that ask first write ``grads.pt``
(the first step's full gradients). Every run sees the same global batch
(``GLOBAL_BATCH`` consecutive samples per step), so all of them follow the single-process loss curve.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils.data import Dataset, default_collate

from longboat.checkpoint.dcp import COMPLETE_MARKER
from longboat.distributed import ParallelConfig, ParallelMesh, resolve_dims
from longboat.distributed.full_state import full_model_state, quiet_sequential_gathers
from longboat.distributed.parallelize import parallelize
from longboat.distributed.names import plain_name
from longboat.models import build_model
from longboat.models import get_model
from longboat.tasks.lm_loss import make_lm_loss
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.trainer.trainer import DataParallel, Trainer

VOCAB, SEQ, STEPS, GLOBAL_BATCH, SAVE_AT = 128, 16, 8, 4, 4
# Adam divides by sqrt(v) + eps: with the usual 1e-8 a gradient entry at rounding-noise level still moves its
# weight by about the learning rate, so runs that differ only in reduction order drift apart by ~1e-3 in 12 steps.
# A larger eps damps those entries; with it a 1e-7 perturbation of the initial weights moves the final ones by
# ~1e-6, while the learning rate still moves them by up to LR per step.
LR, ADAM_EPS = 5e-3, 1e-5
MOVED = 0.75 * LR * STEPS  # how far some weight of a run that trains moves (Adam moves one at most LR a step)
BASE = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
MOE = dict(d_model=32, n_experts=4, top_k=2, expert_ffn_dim=16)
MODELS = {
    "tied": dict(BASE, tie_embeddings=True),
    "untied_qk": dict(BASE, tie_embeddings=False, qk_norm=True, qkv_bias=True),
    # DeepSeek-V3 in small: latent attention, a dense first layer, then sigmoid group-limited routing with a shared
    # expert, bias balancing and the sequence-wise aux loss.
    "deepseek": dict(
        BASE, n_kv_heads=None, attention="mla", q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=8, dense_layers=[0],
        moe=dict(MOE, n_shared_experts=1, score_func="sigmoid", n_groups=2, topk_groups=1, routed_scaling_factor=2.5,
                 use_expert_bias=True, aux_loss="sequence"),
    ),
    # Four layers (the first dense) for two MoE stages per rank at pp 2.
    "deepseek_4": dict(
        BASE, n_layers=4, n_kv_heads=None, attention="mla", q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=8, dense_layers=[0],
        moe=dict(MOE, n_shared_experts=1, score_func="sigmoid", n_groups=2, topk_groups=1, routed_scaling_factor=2.5,
                 use_expert_bias=True, aux_loss="sequence"),
    ),
    # Qwen3-MoE in small: grouped-query attention with q/k norms, softmax routing in every layer, Switch aux loss.
    "qwen3moe": dict(BASE, qk_norm=True, moe=dict(MOE, aux_loss="switch", z_loss_coef=1e-3)),
    # Capacity 1.0 drops 8-24 of each layer's 64 routed copies per 2-sample micro-batch.
    "qwen3moe_capacity": dict(BASE, qk_norm=True, moe=dict(MOE, capacity_factor=1.0)),
    # Qwen2-MoE in small: a sigmoid-gated shared expert beside the routed ones; capacity 1.0 drops copies too.
    "qwen2moe": dict(BASE, qkv_bias=True, moe=dict(MOE, n_shared_experts=1, shared_ffn_dim=32, shared_expert_gate=True,
                                                    capacity_factor=1.0, aux_loss="switch")),
    "untied_4": dict(BASE, tie_embeddings=False, n_layers=4),  # two stages per rank at pp 2
    "tied_4": dict(BASE, tie_embeddings=True, n_layers=4),  # a stage per rank at pp 4
}


@dataclass(frozen=True)
class Case:
    model: str
    parallel: dict = field(default_factory=dict)
    resume_from: str | None = None  # a checkpoint under OUT to start from
    save_every: int = 0
    grad_accum: int = 1
    slow_from: int | None = None  # from this step on, data loading takes a while (a test signals the run then)
    gradients: str = "none"  # "first": write grads.pt before training; "only": write it and stop


CASES = {
    # single process (no torchrun): the references
    "single": Case("tied", save_every=SAVE_AT),
    "single_qk": Case("untied_qk", save_every=SAVE_AT),
    "single_4": Case("untied_4"),
    "single_qk_from_pp": Case("untied_qk", resume_from=f"pp_1f1b/checkpoints/step_{SAVE_AT:08d}"),
    "single_from_fsdp": Case("tied", resume_from=f"fsdp/checkpoints/step_{SAVE_AT:08d}"),
    # 2 ranks
    "fsdp": Case("tied", save_every=SAVE_AT),
    "ddp": Case("tied", {"data_parallel": "ddp"}),
    "ddp_accum": Case("tied", {"data_parallel": "ddp"}, grad_accum=2),
    "fsdp_accum": Case("tied", grad_accum=2),
    "tp": Case("tied", {"tp": 2}),
    "ddp_from_fsdp": Case("tied", {"data_parallel": "ddp"}, resume_from=f"fsdp/checkpoints/step_{SAVE_AT:08d}"),
    "fsdp_from_single": Case("tied", resume_from=f"single/checkpoints/step_{SAVE_AT:08d}"),
    "pp_gpipe": Case("untied_qk", {"pp": 2, "pp_schedule": "gpipe"}, grad_accum=2),
    "pp_1f1b": Case("untied_qk", {"pp": 2}, save_every=SAVE_AT, grad_accum=2),
    "pp_interleaved": Case("untied_4", {"pp": 2, "pp_schedule": "interleaved_1f1b", "pp_virtual_stages": 2},
                           grad_accum=4),
    "pp_from_single": Case("untied_qk", {"pp": 2, "meta_init": True},  # built on the meta device
                           resume_from=f"single_qk/checkpoints/step_{SAVE_AT:08d}", grad_accum=2),
    # 4 ranks
    "hsdp": Case("tied", {"dp_replicate": 2}),
    "fsdp_tp": Case("untied_qk", {"tp": 2}),
    # mixture of experts and latent attention under tensor parallel (test_tp_moe.py)
    "single_deepseek": Case("deepseek", gradients="first"),
    "single_qwen3moe": Case("qwen3moe"),
    "single_qwen2moe": Case("qwen2moe"),
    # The Switch aux loss is not linear in the batch: two data-parallel halves match two accumulated halves.
    "single_qwen3moe_accum": Case("qwen3moe", grad_accum=2, gradients="first"),
    "tp_deepseek": Case("deepseek", {"tp": 2}, save_every=SAVE_AT),
    "tp_qwen3moe": Case("qwen3moe", {"tp": 2}),
    "tp_qwen2moe": Case("qwen2moe", {"tp": 2}),
    "tp_compile_qwen2moe": Case("qwen2moe", {"tp": 2, "compile": True, "activation_checkpointing": "selective"}),
    "fsdp_tp_deepseek": Case("deepseek", {"tp": 2}),
    "fsdp_tp_qwen3moe": Case("qwen3moe", {"tp": 2}),
    "hsdp_tp": Case("tied", {"dp_replicate": 2, "tp": 2}),  # 8 ranks: the smallest model
    "fsdp_from_tp_deepseek": Case("deepseek", resume_from=f"tp_deepseek/checkpoints/step_{SAVE_AT:08d}"),
    "stopped_tp_deepseek": Case("deepseek", {"tp": 2}, slow_from=3),  # stopped by SIGTERM to torchrun
    "single_from_stopped": Case("deepseek", resume_from="stopped_tp_deepseek/checkpoints"),
    # expert parallel (test_expert_parallel.py), against single_deepseek and single_qwen3moe_accum: ep 2,
    # ep 2 × FSDP 2, ep 2 × HSDP
    "single_from_ep_deepseek": Case("deepseek", resume_from=f"ep_deepseek/checkpoints/step_{SAVE_AT:08d}"),
    "ep_deepseek": Case("deepseek", {"ep": 2}, save_every=SAVE_AT, gradients="first"),
    "ep_qwen3moe": Case("qwen3moe", {"ep": 2}, gradients="first"),
    # capacity applies to each rank's copies before dispatch, so ep 2 equals 2-rank FSDP, not one process
    "fsdp_capacity": Case("qwen3moe_capacity", gradients="only"),
    "ep_capacity": Case("qwen3moe_capacity", {"ep": 2}, gradients="only"),
    "ep_fsdp_deepseek": Case("deepseek", {"ep": 2}, gradients="first"),
    "ep_fsdp_qwen3moe": Case("qwen3moe", {"ep": 2, "activation_checkpointing": "selective"}, gradients="only"),
    # compiled around the experts: the blocks' other parts are graphs, the dispatch stays eager; selective
    # checkpointing recomputes around the experts' own FSDP unit
    "ep_compile_qwen3moe": Case("qwen3moe", {"ep": 2, "compile": True, "activation_checkpointing": "selective"},
                                gradients="first"),
    # expert parallel × tensor parallel: ep 2 over the data-parallel ranks, each expert's ffn split over tp 2
    "ep_tp_deepseek": Case("deepseek", {"ep": 2, "tp": 2}, gradients="first"),
    "ep_tp_compile_qwen3moe": Case("qwen3moe", {"ep": 2, "tp": 2, "compile": True, "activation_checkpointing": "full"},
                                   gradients="first"),
    "ep_hsdp_deepseek": Case("deepseek", {"ep": 2, "dp_replicate": 2, "activation_checkpointing": "full"},
                             gradients="only"),
    "pp_fsdp": Case("untied_qk", {"pp": 2, "dp_shard": 2}, grad_accum=2),
    # mixture of experts under pipeline parallel (test_pipeline.py), against one process with the same micro-batches
    "single_deepseek_accum": Case("deepseek", grad_accum=2),
    "single_deepseek_4_accum": Case("deepseek_4", grad_accum=2),
    "pp_qwen3moe": Case("qwen3moe", {"pp": 2}, grad_accum=2),
    "pp_deepseek": Case("deepseek", {"pp": 2}, grad_accum=2),
    "pp_interleaved_deepseek": Case("deepseek_4", {"pp": 2, "pp_schedule": "interleaved_1f1b", "pp_virtual_stages": 2},
                                    grad_accum=2),
    "pp_fsdp_deepseek": Case("deepseek", {"pp": 2, "dp_shard": 2}, grad_accum=2),  # bias loads summed over dp
    # pipeline × tensor parallel: each stage's layers split over its 2 tp ranks, the sequence gathered between stages
    "pp_interleaved_tp": Case("untied_4", {"pp": 2, "tp": 2, "pp_schedule": "interleaved_1f1b",
                                           "pp_virtual_stages": 2}, save_every=SAVE_AT, grad_accum=2),
    "pp_tp_deepseek": Case("deepseek", {"pp": 2, "tp": 2}, grad_accum=2),
    # pipeline × expert parallel: each stage's experts split over its 2 data-parallel ranks
    "pp_ep_qwen3moe": Case("qwen3moe", {"pp": 2, "ep": 2}, grad_accum=2),
    # and compiled: each stage's blocks compiled around their experts, recomputed whole (full AC)
    "pp_ep_compile_qwen3moe": Case("qwen3moe", {"pp": 2, "ep": 2, "compile": True, "activation_checkpointing": "full"},
                                   grad_accum=2),
    # all three: each stage's experts split over ep 2 and tp 2 (8 ranks)
    "pp_ep_tp_qwen3moe": Case("qwen3moe", {"pp": 2, "ep": 2, "tp": 2}, grad_accum=2),
    "single_qwen3moe_accum_4": Case("qwen3moe", grad_accum=4),  # pp_ep_qwen3moe's 2 × 2 one-sample micro-batches
    "single_4_from_pp_tp": Case("untied_4", resume_from=f"pp_interleaved_tp/checkpoints/step_{SAVE_AT:08d}"),
    # tied embeddings under pipeline parallel: the last stage holds a copy of the first stage's table
    "pp_fsdp_tied": Case("tied", {"pp": 2, "dp_shard": 2}, save_every=SAVE_AT, grad_accum=2),
    "pp_tp_tied": Case("tied", {"pp": 2, "tp": 2}, grad_accum=2),
    "pp4_tied": Case("tied_4", {"pp": 4}, grad_accum=4),
    "pp_tied_from_single": Case("tied", {"pp": 2, "meta_init": True},
                                resume_from=f"single/checkpoints/step_{SAVE_AT:08d}", grad_accum=2),
    "single_tied_4": Case("tied_4", grad_accum=4),  # pp4_tied's four one-sample micro-batches
    "single_from_pp_tied": Case("tied", resume_from=f"pp_fsdp_tied/checkpoints/step_{SAVE_AT:08d}"),
    "pp_interleaved_fsdp": Case("untied_4", {"pp": 2, "dp_shard": 2, "pp_schedule": "interleaved_1f1b",
                                             "pp_virtual_stages": 2, "activation_checkpointing": "full"},
                                grad_accum=2),
}


class RepeatingTokens(Dataset):
    """Deterministic samples in which every token repeats the one two places back: quick to learn."""

    def __len__(self) -> int:
        return STEPS * GLOBAL_BATCH

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        head = torch.randint(0, VOCAB, (2,), generator=g)
        x = head.repeat((SEQ + 2) // 2)[: SEQ + 1]
        return {"tokens": x[:-1], "labels": x[1:].clone()}


class SlowTokens(RepeatingTokens):
    """The same samples, each taking a quarter of a second from step ``step`` on."""

    def __init__(self, step: int):
        self.first = step * GLOBAL_BATCH

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i >= self.first:
            time.sleep(0.25)
        return super().__getitem__(i)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_first_gradients(model: torch.nn.Module, dp: DataParallel, path: Path) -> None:
    """The gradients of the first global batch's mean token loss, scaled as the Trainer scales them, in full on
    rank 0: Adam's updates hide a wrongly scaled gradient, and the norm barely sees a few small weights."""
    data, per = RepeatingTokens(), GLOBAL_BATCH // dp.size
    batch = default_collate([data[dp.rank * per + i] for i in range(per)])
    model.eval()  # no aux loss and no expert-load counts, which would move the run's bias updates
    make_lm_loss(False)(model, batch).loss_sum.backward()
    scale = dp.size / (GLOBAL_BATCH * SEQ)  # every label counts
    with quiet_sequential_gathers():  # as an export gathers
        grads = {plain_name(n): (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad) * scale
                 for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    if _rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(grads, path)


def save_layout(model: torch.nn.Module, path: Path) -> None:
    """Each parameter's local shape and placements on this rank (plain tensors: none)."""
    layout = {}
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        layout[plain_name(name)] = {"shape": list(local.shape),
                        "placements": [str(pl) for pl in p.placements] if isinstance(p, DTensor) else []}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(layout, indent=1))


def _wait_for(path: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(0.1)


def run_case(out: Path, name: str) -> None:
    case = CASES[name]
    cfg = ParallelConfig(**case.parallel)
    dims = resolve_dims(cfg, dist.get_world_size() if dist.is_initialized() else 1)
    mesh = ParallelMesh(dims, "cpu") if dist.is_initialized() else None
    torch.manual_seed(0)
    model_cfg = MODELS[case.model]
    with torch.device("meta") if cfg.meta_init else contextlib.nullcontext():
        model = build_model("decoder", model_cfg)
    spec = get_model("decoder")
    loss = make_lm_loss(False)
    pipeline = None
    if dims.pp > 1:
        from longboat.distributed.pipeline import build_pipeline  # torch's pipelining loads its compiler: ~1 s

        model, pipeline = build_pipeline(model, spec.pipeline_split(model.cfg), mesh, cfg, loss, case.grad_accum,
                                         "cpu", spec.parallel_units,
                                         tp_plan=spec.tensor_parallel_plan(model.cfg, dims.tp))
    else:
        model = parallelize(model, mesh, cfg, spec.tensor_parallel_plan(model.cfg, dims.tp), "cpu")
    run_dir = out / name
    if _rank() == 0:
        save_layout(model, run_dir / "layout.json")
    dp = DataParallel(mesh.dp_rank, dims.dp, mesh.dp_group) if mesh is not None else DataParallel()

    if case.gradients != "none":
        save_first_gradients(model, dp, run_dir / "grads.pt")
    if case.gradients == "only":
        _barrier()
        return
    if case.resume_from is not None:
        src = out / case.resume_from  # one checkpoint, or a whole checkpoints/ directory
        if _rank() == 0:
            if src.name != "checkpoints":
                _wait_for(src / COMPLETE_MARKER)  # a run beside this one may still be writing it
            dst = run_dir / "checkpoints"
            shutil.copytree(src, dst if src.name == "checkpoints" else dst / src.name)
        _barrier()
    train_cfg = TrainerConfig(
        steps=STEPS, micro_batch_size=GLOBAL_BATCH // dims.dp // case.grad_accum, grad_accum=case.grad_accum, log_every=1, eval_batches=0, num_workers=0,
        tensorboard=False, threads=1, optimizer={"lr": LR, "eps": ADAM_EPS}, schedule={"kind": "constant"},
    )
    trainer = Trainer(
        train_cfg, CheckpointConfig(every=case.save_every, export=False), run_dir, model, loss,
        RepeatingTokens() if case.slow_from is None else SlowTokens(case.slow_from), dp=dp, device=torch.device("cpu"),
        pipeline=pipeline,
    )
    trainer.fit()
    if pipeline is None:
        state = full_model_state(model, cpu_offload=True)  # as an export gathers
    else:  # each stage holds its own parameters, gathered on rank 0 as for an export
        from longboat.distributed.pipeline import gather_full_state

        state = gather_full_state(model, mesh)
    if _rank() == 0:
        torch.save(state, run_dir / "final.pt")
    _barrier()


def main(out: str, names: list[str]) -> None:
    dist.init_process_group("gloo")
    try:
        for name in names:
            start = time.perf_counter()
            run_case(Path(out), name)
            if _rank() == 0:  # where a launch spends its time, in its log
                print(f"case {name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
