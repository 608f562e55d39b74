"""Train each policy architecture through the policy task and the real Trainer, in one process or under torchrun,
for the distributed equality tests.

    torchrun --nproc_per_node=2 tests/distributed/policy_worker.py OUT DATASET ARCH:LAYOUT [ARCH:LAYOUT ...]

Each case writes ``OUT/<arch>_<layout>/metrics.jsonl`` (training losses, the final validation metrics),
``final.pt`` (the full parameters, gathered to rank 0) and ``units.json`` (the modules sharded and checkpointed
one by one). Every layout sees the same global batch of the same
positions in the sample stream, so the keyed draws (crops, noise) are the same and every run follows the
single-process one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import FSDPModule
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from longboat.distributed import ParallelConfig, ParallelMesh, resolve_dims
from longboat.distributed.parallelize import parallelize
from longboat.recipes.config import resolve
from longboat.trainer.config import CheckpointConfig
from longboat.trainer.optim import freeze_outside
from longboat.trainer.trainer import DataParallel, Trainer

# Every policy architecture with the model fields of its distributed test: other policies add their entry.
ARCHS: dict[str, dict] = {
    "mlp": {"preset": "tiny"},
    "act": {"preset": "tiny"},
    "diffusion": {"preset": "tiny"},
    "flow_vla": {"preset": "tiny", "tokenizer": "tests/fixtures/sft/tokenizer",
                 "vision": {"patch_size": 2, "d_model": 16, "n_layers": 1, "n_heads": 2}},
}
# Diffusion's and flow matching's losses over 6 steps of 8 samples follow their random times and noise more than
# their progress; their learning is shown end to end (test_diffusion.py, tests/recipes/test_flow_vla_train.py).
NOISY_LOSS = {"diffusion", "flow_vla"}
LAYOUTS: dict[str, dict | None] = {
    "single": None,
    "ddp": {"data_parallel": "ddp"},
    "fsdp": {"data_parallel": "fsdp", "activation_checkpointing": "full"},
}
STEPS, GLOBAL_BATCH, SEED = 6, 8, 5
# As in train_worker: a larger Adam eps keeps reduction-order noise from being amplified into visible drift.
LR, ADAM_EPS = 1e-2, 1e-5
CAMERA = "observation.images.top"
TRANSFORMS = [{"type": "normalize", "features": {"observation.state": "mean_std", "action": "mean_std"}},
              {"type": "random_crop", "keys": [CAMERA], "size": [10, 14]}]


def run_config(dataset: str, run_dir: Path, arch: str, micro_batch_size: int) -> dict:
    return {
        "task": "policy", "run_dir": str(run_dir), "seed": SEED,
        "model": {"arch": arch, **ARCHS[arch]},
        "data": {"path": dataset, "transforms": TRANSFORMS, "valid_episodes": [5]},
        "train": {"steps": STEPS, "micro_batch_size": micro_batch_size, "log_every": 1, "eval_every": 0,
                  "eval_batches": 1, "num_workers": 0, "threads": 1, "tensorboard": False,
                  "optimizer": {"lr": LR, "eps": ADAM_EPS}, "schedule": {"kind": "constant"}},
    }


def run_case(out: Path, dataset: str, case: str) -> None:
    arch, layout = case.split(":")
    parallel = ParallelConfig(**(LAYOUTS[layout] or {}))
    dims = resolve_dims(parallel, dist.get_world_size() if dist.is_initialized() else 1)
    mesh = ParallelMesh(dims, "cpu") if dist.is_initialized() else None
    dp = DataParallel(mesh.dp_rank, dims.dp, mesh.dp_group) if mesh is not None else DataParallel()
    run_dir = out / f"{arch}_{layout}"
    resolved = resolve(run_config(dataset, run_dir, arch, GLOBAL_BATCH // dims.dp))
    task, train_cfg = resolved.task, resolved.cfg.train
    data = task.build(resolved.model, train_cfg, SEED, dp.size)
    torch.manual_seed(0)
    model = resolved.spec.build(resolved.model)
    groups = task.param_groups(model)
    freeze_outside(model, groups)  # as longboat train does: parameters in no group (a VLA's unused ones) are frozen
    model = parallelize(model, mesh, parallel, None, "cpu")
    if not dist.is_initialized() or dist.get_rank() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "units.json").write_text(json.dumps(wrapped_units(model)))
    trainer = Trainer(train_cfg, CheckpointConfig(export=False), run_dir, model, data.loss_fn, data.train, data.valid,
                      dp=dp, device=torch.device("cpu"), hooks=task, param_groups=groups, seed=SEED)
    trainer.fit()
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(state, run_dir / "final.pt")
    if dist.is_initialized():
        dist.barrier()


def wrapped_units(model: torch.nn.Module) -> dict[str, list[str]]:
    """The modules sharded on their own (FSDP2 units, the root aside) and those checkpointed, by name."""
    fsdp = [name for name, m in model.named_modules() if isinstance(m, FSDPModule) and name]
    checkpointed = [name.removesuffix("._checkpoint_wrapped_module") for name, m in model.named_modules()
                    if isinstance(m, CheckpointWrapper)]
    return {"fsdp": fsdp, "checkpointed": checkpointed}


def main(out: str, dataset: str, cases: list[str]) -> None:
    dist.init_process_group("gloo")
    try:
        for case in cases:
            run_case(Path(out), dataset, case)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
