"""A tiny Wan video transformer under context parallelism, in one process or under torchrun, for
``test_context_parallel.py``.

    torchrun --nproc_per_node=2 tests/distributed/cp_worker.py OUT CASE [CASE ...]

``parity`` writes ``OUT/parity/result.pt`` (one forward's output and the full gradients of a loss on it),
``layout.json`` (a weight's shard) and ``all_to_all.json`` (the exchanges of a forward and a backward under each
activation checkpointing mode), then asks for a token count the ranks cannot share and writes the refusal to
``refusal.txt``. The other cases train with the real Trainer and a flow-matching loss (the diffusion task trains
class-conditional image models; Wan reads text), each writing ``OUT/<case>/metrics.jsonl``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import Dataset

from longboat.config.base import ConfigError
from longboat.distributed import ParallelConfig, ParallelMesh, resolve_dims
from longboat.distributed.full_state import quiet_sequential_gathers
from longboat.distributed.loss import LossOutput
from longboat.distributed.names import plain_name
from longboat.distributed.parallelize import parallelize
from longboat.models import build_model
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.trainer.trainer import DataParallel, Trainer

# 4 heads, so each of 2 context-parallel ranks attends with 2; 3 × 4 × 4 latents are 12 tokens of (1, 2, 2) patches.
MODEL = dict(in_channels=4, hidden_size=24, num_heads=4, depth=2, ffn_dim=32, text_dim=16, freq_dim=32,
             rope_max_seq_len=16)
VIDEO, TEXT = (4, 3, 4, 4), (5, 16)
STEPS, BATCH = 4, 4
LR, ADAM_EPS = 5e-3, 1e-5  # as train_worker: a larger eps keeps reduction-order noise from growing into drift
CASES: dict[str, dict | None] = {
    "parity": {"cp": 2},
    "single": None,
    "cp": {"cp": 2, "activation_checkpointing": "full"},  # FSDP2 over dp_shard × cp, blocks recomputed
    "cp_ddp": {"cp": 2, "data_parallel": "ddp"},
    "cp_compile": {"cp": 2, "compile": True, "activation_checkpointing": "selective"},
    "single_from_cp": None,  # one process resuming the cp run's checkpoint
}
SAVE_EVERY = {"cp": 2}
RESUME_FROM = {"single_from_cp": "cp/checkpoints/step_00000002"}


def tiny_wan(seed: int = 0) -> torch.nn.Module:
    """The tiny model with every weight drawn (a new Wan's output layer is zero, which would hide the gradients)."""
    torch.manual_seed(seed)
    model = build_model("wan", MODEL)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


def parity_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    x, context = torch.randn(2, *VIDEO, generator=g), torch.randn(2, *TEXT, generator=g)
    return x, torch.rand(2, generator=g), context, torch.randn(2, *VIDEO, generator=g)  # the last weighs the output


def parity_loss(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    x, t, context, weight = parity_inputs()
    out = model(x, t, context)
    return out, (out * weight).sum()


class Clips(Dataset):
    """Deterministic latents, text, noise and flow time per sample position."""

    def __len__(self) -> int:
        return STEPS * BATCH

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(100 + i)
        return {"x": torch.randn(*VIDEO, generator=g), "context": torch.randn(*TEXT, generator=g),
                "noise": torch.randn(*VIDEO, generator=g), "t": torch.rand((), generator=g)}


def flow_loss(model: torch.nn.Module, batch: dict) -> LossOutput:
    """Rectified flow: predict noise − x₀ from (1 − t)·x₀ + t·noise; the per-sample mean squared errors summed."""
    x0, noise, t = batch["x"], batch["noise"], batch["t"]
    tt = t.view(-1, 1, 1, 1, 1)
    pred = model((1 - tt) * x0 + tt * noise, t, batch["context"])
    per_sample = (pred - (noise - x0)).square().flatten(1).mean(1)
    return LossOutput(per_sample.sum(), len(t), len(t))


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _mesh(case: str) -> tuple[ParallelConfig, ParallelMesh | None, DataParallel]:
    cfg = ParallelConfig(**(CASES[case] or {}))
    if not dist.is_initialized():
        return cfg, None, DataParallel()
    dims = resolve_dims(cfg, dist.get_world_size())
    mesh = ParallelMesh(dims, "cpu")
    return cfg, mesh, DataParallel(mesh.dp_rank, dims.dp, mesh.dp_group)


def run_parity(out: Path) -> None:
    cfg, mesh, _ = _mesh("parity")
    model = parallelize(tiny_wan(), mesh, cfg, None, "cpu")
    output, loss = parity_loss(model)
    loss.backward()
    with quiet_sequential_gathers():
        grads = {plain_name(n): p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                 for n, p in model.named_parameters()}
    weight = model.blocks[0].fc1.weight
    layout = {"local": list(weight.to_local().shape), "full": list(weight.shape), "mesh": weight.device_mesh.size()}
    if _rank() == 0:
        torch.save({"output": output.detach(), "grads": grads}, out / "result.pt")
        (out / "layout.json").write_text(json.dumps(layout))
    dist.barrier()
    counts = {mode: count_all_to_alls(mode) for mode in ("none", "selective", "full")}
    if _rank() == 0:
        (out / "all_to_all.json").write_text(json.dumps(counts))
    try:  # 1 × 1 × 3 patches: 3 tokens for 2 ranks
        model(torch.randn(1, 4, 1, 2, 6), torch.rand(1), torch.randn(1, *TEXT))
        message = "no refusal"
    except ConfigError as e:
        message = str(e)
    if _rank() == 0:
        (out / "refusal.txt").write_text(message)


class _CountAllToAlls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops._c10d_functional.all_to_all_single.default
        return func(*args, **(kwargs or {}))


def count_all_to_alls(checkpointing: str) -> dict[str, int]:
    """The all-to-alls one forward and its backward dispatch under ``parallel.activation_checkpointing``."""
    cfg = ParallelConfig(cp=2, activation_checkpointing=checkpointing)
    model = parallelize(tiny_wan(), ParallelMesh(resolve_dims(cfg, dist.get_world_size()), "cpu"), cfg, None, "cpu")
    with _CountAllToAlls() as counter:
        _, loss = parity_loss(model)
        forward = counter.count
        loss.backward()
    return {"forward": forward, "backward": counter.count - forward}


def run_training(out: Path, case: str) -> None:
    cfg, mesh, dp = _mesh(case)
    model = parallelize(tiny_wan(), mesh, cfg, None, "cpu")
    if case in RESUME_FROM:
        shutil.copytree(out.parent / RESUME_FROM[case], out / "checkpoints" / Path(RESUME_FROM[case]).name)
    train_cfg = TrainerConfig(
        steps=STEPS, micro_batch_size=BATCH // dp.size, log_every=1, eval_batches=0, num_workers=0,
        tensorboard=False, threads=1, optimizer={"lr": LR, "eps": ADAM_EPS}, schedule={"kind": "constant"})
    checkpoints = CheckpointConfig(every=SAVE_EVERY.get(case, 0), export=False)
    Trainer(train_cfg, checkpoints, out, model, flow_loss, Clips(), dp=dp, device=torch.device("cpu")).fit()


def run_case(out: Path, case: str) -> None:
    (out / case).mkdir(parents=True, exist_ok=True)
    if case == "parity":
        run_parity(out / case)
    else:
        run_training(out / case, case)
    if dist.is_initialized():
        dist.barrier()


def main(out: str, cases: list[str]) -> None:
    dist.init_process_group("gloo")
    try:
        for case in cases:
            run_case(Path(out), case)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
