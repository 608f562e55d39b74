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
from longboat.data.tokenizer import TOKENIZER_FILES
from longboat.distributed import ParallelMesh, Runtime, build_mesh, init_runtime, launched_world_size, shutdown
from longboat.distributed.full_state import full_model_state
from longboat.distributed.parallelize import parallelize
from longboat.distributed.rank0_weights import load_from_rank0
from longboat.errors import StoppedByPeer
from longboat.recipes.artifact import export_metadata
from longboat.recipes.config import ResolvedRun
from longboat.recipes.preflight import Preflight, preflight
from longboat.recipes.transforms import build_model, describe_transforms, folded_records, plain_weights, trainable_groups
from longboat.trainer.optim import freeze_outside
from longboat.trainer.trainer import DataParallel, FitResult, Trainer
from longboat.utils.device import set_threads
from longboat.utils.logging import console
from longboat.utils.outputs import replace_file
from longboat.utils.provenance import provenance
from longboat.utils.run_lock import RunDirLock
from longboat.utils.seeding import seed_everything


def export_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "export"


@contextlib.contextmanager
def _local_rank_zero_first(runtime: Runtime):
    """Let one process per node build shared caches (dataset indices) before the others read them.

    The builders' verdict travels to every rank: when a builder fails (bad data, say), the ranks that waited stop
    quietly with ``StoppedByPeer`` instead of a collective's traceback, and the builder's one-line error is the job's.
    """
    if not runtime.distributed:
        yield
        return
    if runtime.local_rank != 0:
        if _verdict(runtime, failed=False):
            raise StoppedByPeer("a rank building the shared data failed")
        yield
        return
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # the others may be gone already
            _verdict(runtime, failed=True)
        raise
    if _verdict(runtime, failed=False):
        raise StoppedByPeer("another node's rank building the shared data failed")


def _verdict(runtime: Runtime, failed: bool) -> bool:
    """Whether any rank failed: one all-reduce of a flag, the barrier the builders and the waiting ranks meet at."""
    flag = torch.tensor([float(failed)], device=runtime.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def run(resolved: ResolvedRun) -> FitResult:
    cfg = resolved.cfg
    # Checks that need no communication come first, so a mistake fails on every rank instead of hanging.
    checked = preflight(resolved, launched_world_size() or 1)
    runtime = init_runtime(cfg.parallel.backend, cfg.train.device, cfg.parallel.timeout_minutes)
    try:
        with RunDirLock(cfg.run_dir) if runtime.rank == 0 else contextlib.nullcontext():
            result = _run(resolved, runtime, checked)
        if runtime.distributed:
            # Leave together: a rank that tears its process group down while another is still exporting (rank 0's
            # work) has been seen to abort in the teardown ("terminate called without an active exception").
            dist.barrier()
        return result
    finally:
        shutdown(runtime)


def _run(resolved: ResolvedRun, runtime: Runtime, checked: Preflight) -> FitResult:
    cfg, task, spec = resolved.cfg, resolved.task, resolved.spec
    run_dir = Path(cfg.run_dir)
    if runtime.rank == 0:
        replace_file(run_dir / "config.yaml", resolved.to_yaml())  # after preflight found it fits the checkpoints
        replace_file(run_dir / "provenance.json", json.dumps(provenance(), indent=2) + "\n")
    set_threads(cfg.train.threads)
    seed_everything(cfg.seed)
    mesh: ParallelMesh | None = build_mesh(cfg.parallel, runtime.device.type) if runtime.distributed else None
    dp = DataParallel(mesh.dp_rank, mesh.dims.dp, mesh.dp_group) if mesh is not None else DataParallel()

    with _local_rank_zero_first(runtime):
        data = task.build(resolved.model, cfg.train, cfg.seed, dp.size)
    model = _built(resolved, runtime)
    n_params = sum(p.numel() for p in model.parameters())
    groups = trainable_groups(resolved, model)
    n_frozen = freeze_outside(model, groups)
    pipeline = None
    if checked.pipeline is not None:
        if not all(callable(getattr(data.loss_fn, part, None)) for part in ("model_inputs", "output_loss", "aux_loss")):
            raise ConfigError(f"parallel.pp={cfg.parallel.pp}: the {cfg.task} task's loss cannot be split into "
                              "pipeline stages; set parallel.pp=1")
        from longboat.distributed.pipeline import build_pipeline  # torch's pipelining loads its compiler: ~1 s

        model, pipeline = build_pipeline(model, checked.pipeline, mesh, cfg.parallel, data.loss_fn,
                                         cfg.train.grad_accum, runtime.device, spec.parallel_units,
                                         spec.forward_methods, checked.tp_plan)
    else:
        model = parallelize(model, mesh, cfg.parallel, checked.tp_plan, runtime.device, spec.parallel_units,
                            spec.forward_methods)
    if resolved.source.hf is not None:
        _load_hf_weights(model, resolved.source.hf, resolved, runtime)
    elif resolved.source.lerobot is not None:
        from longboat.models.policy import read_lerobot  # the converters: imported where a run starts from LeRobot

        every_rank = cfg.parallel.pp > 1
        weights = [read_lerobot(resolved.source.lerobot).state_dict] if runtime.rank == 0 or every_rank else None
        _load_weights(model, weights, runtime, every_rank)
        console.print(f"weights from {resolved.source.lerobot}")
    elif spec.initial_weights is not None and spec.initial_weights.source(resolved.model) is not None:
        _load_initial_weights(model, resolved, runtime)
    layout = f" · mesh {mesh} ({cfg.parallel.data_parallel})" if mesh is not None else ""
    frozen = f" ({_count(n_params - n_frozen)} trainable, {_count(n_frozen)} frozen)" if n_frozen else ""
    console.print(
        f"[bold]{cfg.task}[/] · {resolved.arch} {_count(n_params)} parameters{frozen}{describe_transforms(resolved)}"
        f" · device {runtime.device}"
        + layout + " · " + " · ".join(f"{k} {v}" for k, v in data.summary.items())
    )
    trainer = Trainer(
        cfg.train, cfg.checkpoint, run_dir, model, data.loss_fn, data.train, data.valid,
        flops_per_unit=task.flops_per_unit(resolved.model), dp=dp, device=runtime.device, hooks=task,
        param_groups=groups, seed=cfg.seed, pipeline=pipeline,
        replica=None if pipeline is not None else lambda: parallelize(
            _built(resolved, runtime), mesh, cfg.parallel, checked.tp_plan, runtime.device, spec.parallel_units,
            spec.forward_methods),
    )
    result = trainer.fit()
    if (cfg.checkpoint.export or cfg.checkpoint.export_hf) and not result.stopped_by_signal:
        with trainer.ema.swapped_in() if trainer.ema is not None else contextlib.nullcontext():
            _export(model, resolved, runtime, checked.hf_family, ema=trainer.ema is not None,
                    mesh=mesh if pipeline is not None else None)
    return result


def _built(resolved: ResolvedRun, runtime: Runtime) -> torch.nn.Module:
    """The plain model with its transforms, on the meta device when parallelize materialises it."""
    if resolved.cfg.parallel.meta_init:
        return build_model(resolved, "meta")
    return build_model(resolved).to(runtime.device)


def _count(n: int) -> str:
    """A parameter count to three or so significant figures: 1.2B, 12.3M, 4.1K."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _load_hf_weights(model: torch.nn.Module, hf_dir: str, resolved: ResolvedRun, runtime: Runtime) -> None:
    """Start from an HF checkpoint's weights (a resumed run's checkpoint overrides them later).

    Rank 0 reads the files one shard file at a time (every rank, for its own pipeline stages); under FSDP/TP each
    rank receives only its own shards by broadcast. The reader checks that every base tensor is there before any
    is sent; LoRA adapters, which the checkpoint does not hold, keep their initial values.
    """
    every_rank = resolved.cfg.parallel.pp > 1
    groups = resolved.spec.hf.stream_weights(hf_dir, resolved.model) if runtime.rank == 0 or every_rank else None
    _load_weights(model, groups, runtime, every_rank)
    console.print(f"weights from {hf_dir}")


def _load_initial_weights(model: torch.nn.Module, resolved: ResolvedRun, runtime: Runtime) -> None:
    """Start the parameters the spec's ``initial_weights`` cover from them (e.g. a VLA's pretrained backbone),
    the rest as initialised; a resumed run's checkpoint overrides them later."""
    weights = resolved.spec.initial_weights
    every_rank = resolved.cfg.parallel.pp > 1
    groups = [weights.read(resolved.model)] if runtime.rank == 0 or every_rank else None
    _load_weights(model, groups, runtime, every_rank)
    console.print(f"initial weights from {weights.source(resolved.model)}")


def _load_weights(model: torch.nn.Module, groups, runtime: Runtime, every_rank: bool) -> None:
    """Load groups of full tensors read by rank 0; under FSDP/TP each rank receives only its own shards by
    broadcast, a group at a time.

    ``every_rank``: each rank read the weights itself (pipeline stages hold different parameters) and keeps
    those of its own stages.
    """
    if not every_rank:
        load_from_rank0(model, groups, runtime.distributed)
        return
    own = set(get_model_state_dict(model))
    options = StateDictOptions(full_state_dict=True, strict=False)
    for group in groups:
        set_model_state_dict(model, {k: v for k, v in group.items() if k in own}, options=options)


def _export(model: torch.nn.Module, resolved: ResolvedRun, runtime: Runtime, hf_family: str | None, ema: bool,
            mesh: ParallelMesh | None = None) -> None:
    """Write the safetensors export from rank 0; in a distributed run every rank takes part in the gather.
    ``mesh`` is given for a pipeline, whose stages each hold part of the weights."""
    cfg = resolved.cfg
    weights: torch.nn.Module | dict = model
    if mesh is not None:
        from longboat.distributed.pipeline import gather_full_state

        weights = gather_full_state(model, mesh)
    elif runtime.distributed or cfg.checkpoint.export_hf or resolved.transforms:
        # Gathered tensor by tensor and moved to CPU on rank 0 only: no rank holds a second full copy on device,
        # and the other ranks get an empty dict.
        weights = full_model_state(model, cpu_offload=True)
    if runtime.rank != 0:
        return
    if resolved.transforms:  # exports hold the plain architecture: e.g. LoRA's adapters folded into the weights
        weights = plain_weights(resolved, weights, Path(cfg.run_dir))
    assets = resolved.task.export_assets()
    if cfg.checkpoint.export:
        out = save_export(
            export_dir(cfg.run_dir), weights, resolved.arch, resolved.model.model_dump(mode="json"), assets,
            extra=export_metadata(cfg.task, cfg.plugins, ema, folded_records(resolved)),
        )
        console.print(f"exported to {out}")
    if cfg.checkpoint.export_hf:
        tokenizer_dir = Path(assets["tokenizer.json"]).parent if isinstance(assets.get("tokenizer.json"), Path) else None
        out = resolved.spec.hf.save(weights, hf_family, Path(cfg.run_dir) / "hf", resolved.model,
                                    tokenizer_dir=tokenizer_dir)
        # Tokenizer files the task rewrote (e.g. the chat template the run trained with) replace the copies.
        for name, content in assets.items():
            if name in TOKENIZER_FILES and isinstance(content, bytes):
                (Path(out) / name).write_bytes(content)
        console.print(f"exported Hugging Face checkpoint to {out}")
