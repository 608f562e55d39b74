"""``longboat train``: build the model and the task's data, run the trainer, export the result.

Under ``torchrun`` the same function runs on every rank: it joins the process group, builds the mesh the
``parallel`` section describes and applies the parallelism before the trainer sees the model.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from longboat.checkpoint.export import save_export
from longboat.config.base import ConfigError
from longboat.distributed import ParallelMesh, Runtime, build_mesh, init_runtime, launched_world_size, parallelize
from longboat.distributed import resolve_dims, shutdown
from longboat.models import get_model
from longboat.recipes.config import ResolvedRun
from longboat.tasks import get_task
from longboat.trainer.trainer import DataParallel, FitResult, Trainer
from longboat.utils.logging import console
from longboat.utils.provenance import provenance
from longboat.utils.seeding import seed_everything


def export_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "export"


def tensor_parallel_plan(arch: str, model_cfg, tp: int) -> dict | None:
    """The architecture's TP plan (checked against the model's heads), or None when ``tp == 1``."""
    if tp == 1:
        return None
    if arch == "decoder":
        from longboat.models.llm.parallel_plan import check_tensor_parallel, tensor_parallel_plan as plan

        check_tensor_parallel(model_cfg, tp)
        return plan(model_cfg)
    raise ConfigError(f"model '{arch}' has no tensor-parallel plan; set parallel.tp=1")


@contextlib.contextmanager
def _local_rank_zero_first(runtime: Runtime):
    """Let one process per node build shared caches (dataset indices) before the others read them."""
    if runtime.distributed and runtime.local_rank != 0:
        dist.barrier()
    yield
    if runtime.distributed and runtime.local_rank == 0:
        dist.barrier()


def run(resolved: ResolvedRun) -> FitResult:
    cfg = resolved.cfg
    # Checks that need no communication come first, so a wrong mesh fails on every rank instead of hanging.
    dims = resolve_dims(cfg.parallel, launched_world_size() or 1)
    tp_plan = tensor_parallel_plan(resolved.arch, resolved.model, dims.tp)
    if cfg.checkpoint.export_hf:
        _hf_export_family(resolved)  # an unknown or unfit family fails now, not after training
    runtime = init_runtime(cfg.parallel.backend, cfg.train.device)
    result = _run(resolved, runtime, tp_plan)
    shutdown(runtime)
    return result


def _run(resolved: ResolvedRun, runtime: Runtime, tp_plan: dict | None) -> FitResult:
    cfg = resolved.cfg
    run_dir = Path(cfg.run_dir)
    if runtime.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(resolved.to_yaml())
        (run_dir / "provenance.json").write_text(json.dumps(provenance(), indent=2) + "\n")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed_everything(cfg.seed)
    mesh: ParallelMesh | None = build_mesh(cfg.parallel, runtime.device.type) if runtime.distributed else None
    dp = DataParallel(mesh.dp_rank, mesh.dims.dp, mesh.dp_group) if mesh is not None else DataParallel()

    task = get_task(cfg.task)
    with _local_rank_zero_first(runtime):
        parts = task.build(resolved.data, resolved.model, cfg.train, cfg.seed, dp_size=dp.size)
    _, model_cls = get_model(resolved.arch)
    if cfg.parallel.meta_init:
        with torch.device("meta"):
            model = model_cls(resolved.model)
    else:
        model = model_cls(resolved.model).to(runtime.device)
    n_params = sum(p.numel() for p in model.parameters())
    model = parallelize(model, mesh, cfg.parallel, tp_plan, runtime.device)
    if "hf" in cfg.model:
        _load_hf_weights(model, cfg.model["hf"], resolved, runtime)
    layout = f" · mesh {mesh} ({cfg.parallel.data_parallel})" if mesh is not None else ""
    console.print(
        f"[bold]{cfg.task}[/] · {resolved.arch} {n_params / 1e6:.1f}M parameters · device {runtime.device}"
        + layout + " · " + " · ".join(f"{k} {v}" for k, v in parts.summary.items())
    )
    trainer = Trainer(
        cfg.train, cfg.checkpoint, run_dir, model, parts.loss_fn, parts.train, parts.valid,
        flops_per_unit=parts.flops_per_unit, dp=dp, device=runtime.device, after_step=parts.after_step,
    )
    result = trainer.fit()
    if (cfg.checkpoint.export or cfg.checkpoint.export_hf) and not result.stopped_by_signal:
        _export(model, resolved, parts.tokenizer_dir, runtime)
    return result


def _hf_export_family(resolved: ResolvedRun) -> str:
    """``checkpoint.export_hf``'s family: named, else the HF source's, else the one the model config implies."""
    from longboat.models.llm.hf import get_hf_adapter, infer_family, read_hf_config

    family = resolved.cfg.checkpoint.export_hf
    if family is True:
        hf_dir = resolved.cfg.model.get("hf")
        family = read_hf_config(hf_dir)["model_type"] if hf_dir else infer_family(resolved.model)
    get_hf_adapter(family).config_to_hf(resolved.model)
    return family


def _load_hf_weights(model: torch.nn.Module, hf_dir: str, resolved: ResolvedRun, runtime: Runtime) -> None:
    """Start from an HF checkpoint's weights (a resumed run's checkpoint overrides them later).

    Rank 0 reads the files; under FSDP/TP each rank receives only its own shards by broadcast.
    """
    from longboat.models.llm.hf import get_hf_adapter, read_hf_config, read_hf_weights

    state = {}
    if runtime.rank == 0:
        adapter = get_hf_adapter(read_hf_config(hf_dir).get("model_type"))
        state = read_hf_weights(hf_dir, adapter, resolved.model)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=runtime.distributed)
    set_model_state_dict(model, state, options=options)
    console.print(f"weights from {hf_dir}")


def _export(model: torch.nn.Module, resolved: ResolvedRun, tokenizer_dir, runtime: Runtime) -> None:
    """Write the safetensors export from rank 0; in a distributed run every rank takes part in the gather."""
    weights: torch.nn.Module | dict = model
    if runtime.distributed or resolved.cfg.checkpoint.export_hf:
        # Gathered tensor by tensor and moved to CPU on rank 0 only: no rank holds a second full copy on device,
        # and the other ranks get an empty dict.
        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if runtime.rank == 0 and resolved.cfg.checkpoint.export:
        out = save_export(
            export_dir(resolved.cfg.run_dir), weights, resolved.arch, resolved.model.model_dump(mode="json"),
            tokenizer_dir,
        )
        console.print(f"exported to {out}")
    if runtime.rank == 0 and resolved.cfg.checkpoint.export_hf:
        from longboat.models.llm.hf import save_hf_model

        out = save_hf_model(weights, _hf_export_family(resolved), Path(resolved.cfg.run_dir) / "hf",
                            cfg=resolved.model, tokenizer_dir=tokenizer_dir)
        console.print(f"exported Hugging Face checkpoint to {out}")
