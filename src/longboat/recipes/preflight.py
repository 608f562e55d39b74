"""Everything a training run can check without training, before it writes anything.

``longboat train CONFIG --check`` runs these checks alone; ``longboat train`` runs them first on every rank, so a
mistake fails at once everywhere instead of after data loading, or on one rank while the others wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from longboat.checkpoint.catalog import latest_checkpoint
from longboat.config.base import ConfigError, validate
from longboat.distributed import ParallelDims, resolve_dims
from longboat.distributed.layout_checks import check_expert_parallel, check_microbatches, pipeline_layer_counts
from longboat.models import get_model
from longboat.models.registry import PipelineSplit
from longboat.recipes.config import TRANSFORMS, ResolvedRun
from longboat.recipes.transforms import build_model, folded_records, trainable_groups
from longboat.utils.device import resolve_device


@dataclass
class Preflight:
    dims: ParallelDims
    tp_plan: dict | None
    hf_family: str | None
    resume_from: Path | None  # the checkpoint the run will resume from, if any
    pipeline: PipelineSplit | None = None  # how the model is cut into stages when parallel.pp > 1


def preflight(resolved: ResolvedRun, world_size: int) -> Preflight:
    """Device, mesh arithmetic, model transforms (LoRA targets), tensor-, context- and expert-parallel fit, HF export
    family, data against the model, resume."""
    cfg = resolved.cfg
    resolve_device(cfg.train.device)
    dims = resolve_dims(cfg.parallel, world_size)
    for transform in resolved.transforms:
        transform.check_parallel(dims.tp)
    if resolved.transforms or cfg.train.param_groups:
        check_param_rules(resolved)
    tp_plan = resolved.spec.tensor_parallel_plan(resolved.model, dims.tp)
    resolved.spec.sequence_plan(resolved.model, dims.cp)
    if dims.ep > 1:
        with torch.device("meta"):
            check_expert_parallel(resolved.spec.build(resolved.model), dims.ep)
    pipeline = check_pipeline(resolved) if dims.pp > 1 else None
    family = hf_export_family(resolved) if cfg.checkpoint.export_hf else None
    resolved.task.check(resolved.model)
    resume_from = check_resume(resolved) if cfg.checkpoint.resume else None
    return Preflight(dims, tp_plan, family, resume_from, pipeline)


def check_param_rules(resolved: ResolvedRun) -> None:
    """The transforms (LoRA's targets) and ``train.param_groups`` against the model's parameters, on a model that
    holds no memory."""
    trainable_groups(resolved, build_model(resolved, "meta"))


def check_pipeline(resolved: ResolvedRun) -> PipelineSplit:
    """The model can be cut into ``parallel.pp × pp_virtual_stages`` stages, and the step's micro-batches fit the
    schedule."""
    cfg = resolved.cfg
    split = resolved.spec.pipeline_split(resolved.model)
    with torch.device("meta"):
        pipeline_layer_counts(resolved.spec.build(resolved.model), split, cfg.parallel)
    check_microbatches(cfg.parallel, cfg.train.grad_accum)
    if cfg.train.eval_batches % cfg.train.grad_accum:
        raise ConfigError(f"train.eval_batches={cfg.train.eval_batches} must be a multiple of train.grad_accum="
                          f"{cfg.train.grad_accum} with parallel.pp > 1: the pipeline evaluates a step's worth of "
                          "micro-batches at a time")
    return split


def hf_export_family(resolved: ResolvedRun) -> str:
    """``checkpoint.export_hf``'s family: named, else the HF source's, else the one the model config implies."""
    spec = resolved.spec
    if spec.hf is None:
        raise ConfigError(f"checkpoint.export_hf: model '{spec.name}' has no Hugging Face format")
    return spec.hf.export_family(resolved.model, resolved.cfg.checkpoint.export_hf, resolved.source.hf)


def check_resume(resolved: ResolvedRun) -> Path | None:
    """The checkpoint a rerun resumes from, after checking that it holds this model for this task.

    Another parallel layout is not a conflict (checkpoints reshard); another model shape, task, set of LoRA
    adapters or ``train.param_groups`` (the optimizer state's layout) is, and the error names every field that
    differs, leaving the run directory untouched.
    """
    run_dir = Path(resolved.cfg.run_dir)
    latest = latest_checkpoint(run_dir / "checkpoints")
    saved_path = run_dir / "config.yaml"
    if latest is None or not saved_path.is_file():
        return latest
    try:
        saved = yaml.safe_load(saved_path.read_text())
        saved_model = dict(saved["model"])
        saved_arch = saved_model.pop("arch")
        saved_task = saved.get("task", "pretrain")
        saved_transforms = {key: saved.get(key) for key in TRANSFORMS}
        saved_rules = (saved.get("train") or {}).get("param_groups") or []
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{saved_path}: unreadable ({e}); it describes the checkpoints in {run_dir}") from None
    differences = []
    if saved_task != resolved.cfg.task:
        differences.append(f"task {saved_task} there, {resolved.cfg.task} here")
    if saved_arch != resolved.arch:
        differences.append(f"model.arch {saved_arch} there, {resolved.arch} here")
    else:
        theirs = validate(get_model(saved_arch).config, saved_model, str(saved_path), prefix="model").model_dump()
        ours = resolved.model.model_dump()
        differences += [f"model.{k} {theirs.get(k)!r} there, {ours.get(k)!r} here"
                        for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)]
    ours_transforms = {key: None for key in TRANSFORMS} | folded_records(resolved)
    differences += [f"{key} {saved_transforms[key]!r} there, {ours_transforms[key]!r} here"
                    for key in TRANSFORMS if saved_transforms[key] != ours_transforms[key]]
    ours_rules = [r.model_dump(mode="json") for r in resolved.cfg.train.param_groups]
    if saved_rules != ours_rules:
        # Another set of groups is another optimizer-state layout, and the saved groups' learning rates would
        # silently override the new scales.
        differences.append(f"train.param_groups {saved_rules!r} there, {ours_rules!r} here")
    if differences:
        raise ConfigError(
            f"run_dir {run_dir} holds checkpoints ({latest.name}) of another model: " + "; ".join(differences)
            + ". Resume with the same model, choose another run_dir, or set checkpoint.resume=false"
        )
    return latest
