"""Checks of a parallel layout against a model that need no process group: the mesh arithmetic's neighbours.

``longboat train --check`` runs them without loading torch.distributed's pipelining, DTensor or checkpoint code;
the parallelizers call the same functions before they touch a collective.
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

from longboat.config.base import ConfigError
from longboat.distributed.config import ParallelConfig
from longboat.models.contracts import ExpertSets
from longboat.models.registry import PipelineSplit, hooks_of


def expert_sets(model: nn.Module) -> ExpertSets | None:
    """What ``model``'s spec declares about its expert sets (None: it has none)."""
    return hooks_of(model).experts


def expert_modules(model: nn.Module, within: nn.Module | None = None) -> list[nn.Module]:
    """The expert sets of ``model`` (those inside ``within``, one of its modules, when given)."""
    sets = expert_sets(model)
    return sets.modules(model if within is None else within) if sets is not None else []


def check_expert_parallel(model: nn.Module, ep: int) -> None:
    """Raise (on every rank alike, before any collective) unless every expert set splits ``ep`` ways."""
    if ep == 1:
        return
    experts = expert_modules(model)
    if not experts:
        raise ConfigError(f"parallel.ep={ep} needs a mixture-of-experts model; {type(model).__name__} has no experts")
    for module in experts:
        n = expert_sets(model).n_experts(module)
        if n % ep:
            raise ConfigError(f"parallel.ep={ep} must divide the model's n_experts ({n})")


def stage_layer_counts(n_layers: int, n_stages: int, explicit: Sequence[int] | None = None) -> list[int]:
    """Layers per stage: ``explicit`` (``parallel.pp_layers``) or an even split in which the first
    ``n_layers % n_stages`` stages take one layer more (the last stage also runs the head and the loss)."""
    if explicit is not None:
        if sum(explicit) != n_layers:
            raise ConfigError(f"parallel.pp_layers={list(explicit)} sums to {sum(explicit)} layers, but the model "
                              f"has {n_layers}")
        return list(explicit)
    if n_stages > n_layers:
        raise ConfigError(f"parallel: {n_stages} pipeline stages (pp × pp_virtual_stages) need at least as many "
                          f"layers, but the model has {n_layers}")
    base, extra = divmod(n_layers, n_stages)
    return [base + (i < extra) for i in range(n_stages)]


def check_microbatches(cfg: ParallelConfig, n_microbatches: int) -> None:
    """The schedule's demands on the step's micro-batch count (``train.grad_accum``), before any work."""
    stages = cfg.pp * cfg.pp_virtual_stages
    if cfg.pp_schedule == "1f1b" and n_microbatches < stages:
        raise ConfigError(f"train.grad_accum={n_microbatches}: parallel.pp_schedule=1f1b needs at least one "
                          f"micro-batch per stage ({stages})")
    if cfg.pp_schedule == "interleaved_1f1b" and n_microbatches % cfg.pp:
        raise ConfigError(f"train.grad_accum={n_microbatches}: parallel.pp_schedule=interleaved_1f1b needs a "
                          f"multiple of parallel.pp={cfg.pp} micro-batches")


def check_split(model: nn.Module, split: PipelineSplit) -> nn.ModuleList:
    """The model's layer list, after checking that the split names its children."""
    children = dict(model.named_children())
    for name in (split.layers, *split.first, *split.last):
        if name not in children:
            raise ConfigError(f"the pipeline split of {type(model).__name__} names '{name}', which is not one of its "
                              f"children ({', '.join(children)})")
    layers = children[split.layers]
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(f"the pipeline split's layers '{split.layers}' of {type(model).__name__} is not a ModuleList")
    return layers


def pipeline_layer_counts(model: nn.Module, split: PipelineSplit, cfg: ParallelConfig) -> list[int]:
    """The layers of each stage ``cfg`` gives ``model`` (checked; the model may be on the meta device)."""
    layers = check_split(model, split)
    return stage_layer_counts(len(layers), cfg.pp * cfg.pp_virtual_stages, cfg.pp_layers)
