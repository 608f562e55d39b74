"""Tensor parallel inside pipeline stages: the model's plan applied to what a rank keeps of the model.

Each stage runs the plan's styles on its own layers over the ``tp`` ranks of its pipeline slice, as the
non-pipelined run does for the whole model. Two things differ at the stage boundaries:

- A sequence-parallel plan leaves the residual stream between layers sharded over the sequence. A stage hands
  the next one the whole sequence: its last layer's output is gathered over ``tp``, and the next stage's first
  layer keeps only its rank's shard. The model then sees the full sequence length where it reads it (RoPE
  positions, the attention mask) on every stage, and the schedule's shape inference sees the same shapes on every
  ``tp`` rank. (Each ``tp`` rank sends the whole activation: ``tp`` times the bytes of sending shards.)
- The plan's root entry (``""``) shapes the model's output, the logits, which only the last stage returns.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from longboat.config.base import ConfigError
from longboat.distributed.parallelize import apply_tensor_parallel, plan_entry_matches
from longboat.models.registry import PipelineSplit


def check_plan(model: nn.Module, plan: dict[str, ParallelStyle]) -> None:
    """Every entry of ``plan`` names a module of the full ``model`` (before it is cut into stages)."""
    names = [name for name, _ in model.named_modules()]
    for pattern in plan:
        if not any(plan_entry_matches(name, pattern) for name in names):
            raise ConfigError(f"tensor-parallel plan entry '{pattern}' matches no module of {type(model).__name__}; "
                              "the plan is out of date with the model")


def _keep_shard(mesh: DeviceMesh, dim: int):
    """Pre-hook of a stage's first layer: the whole sequence arrives from the previous stage; keep this rank's shard
    (the backward gathers the gradient)."""
    def hook(module: nn.Module, args: tuple) -> tuple:
        whole = DTensor.from_local(args[0], mesh, (Replicate(),), run_check=False)
        return (whole.redistribute(placements=(Shard(dim),)).to_local(), *args[1:])
    return hook


def _gather(mesh: DeviceMesh, dim: int):
    """Hook of a stage's last layer: gather the sequence for the next stage (the backward keeps the shard's part)."""
    def hook(module: nn.Module, args: tuple, output: tuple[torch.Tensor, dict | None]) -> tuple:
        h, aux = output  # a block returns (hidden states, its MoE aux or None)
        shard = DTensor.from_local(h, mesh, (Shard(dim),), run_check=False)
        return shard.redistribute(placements=(Replicate(),)).to_local(), aux
    return hook


def apply_stage_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, ParallelStyle],
                                split: PipelineSplit, stages: Sequence[tuple[range, bool, bool]],
                                split_already: Sequence[nn.Module] = ()) -> None:
    """Apply ``plan`` (checked against the full model) to the rank's pruned ``model``: the entries that name a module
    it keeps, except the root's (see ``apply_output_tensor_parallel``). ``stages``: each of the rank's stages as
    (its layer indices, whether it is the first stage, whether the last); ``split_already`` as for
    ``apply_tensor_parallel``."""
    kept = [name for name, _ in model.named_modules()]
    apply_tensor_parallel(model, tp_mesh, {pattern: style for pattern, style in plan.items()
                                           if pattern and any(plan_entry_matches(name, pattern) for name in kept)},
                          split_already)
    dim = split.tp_sequence_dim
    if dim is None:
        return
    layers = model.get_submodule(split.layers)
    for layer_ids, first, last in stages:
        if not first:
            layers[str(layer_ids[0])].register_forward_pre_hook(_keep_shard(tp_mesh, dim))
        if not last:
            layers[str(layer_ids[-1])].register_forward_hook(_gather(tp_mesh, dim))


def apply_output_tensor_parallel(stage: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, ParallelStyle]) -> None:
    """The plan's root entry on the module that runs the last stage, which returns the model's output."""
    if "" in plan:
        parallelize_module(stage, tp_mesh, plan[""])
