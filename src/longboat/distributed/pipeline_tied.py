"""Weights that the first and the last pipeline stage share: a tied model's embedding table, which its head reads.

Both stages hold the table under its own name, so checkpoints stay the unpipelined model's (DCP writes one of the two
equal copies). The copies start equal (the first stage's is sent to the last) and stay equal: after each step's
backward their gradients are summed, so each holds the tied parameter's whole gradient and the optimizer makes the
same update to both. The gradient norm counts them once. (Megatron-LM keeps its embedding group the same way.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from longboat.distributed.mesh import ParallelMesh
from longboat.models.registry import PipelineSplit


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class TiedWeights:
    """The tied parameters of this rank's pruned ``model`` (none unless it runs the first or the last stage), and
    the group of the two ranks holding them. Created on every rank (the group is a collective)."""

    def __init__(self, model: nn.Module, split: PipelineSplit, mesh: ParallelMesh, first: bool, last: bool):
        self.names: list[str] = []
        self.group, self.source, self.is_copy = None, None, False
        if not split.tied:
            return
        ranks = mesh.world.mesh  # [pp, dp_replicate, dp_shard, cp, tp]
        pairs = torch.stack([ranks[0].flatten(), ranks[-1].flatten()], dim=1).tolist()
        self.group, _ = dist.new_subgroups_by_enumeration(pairs)
        self.source = next((a for a, b in pairs if dist.get_rank() in (a, b)), None)  # the first stage's rank
        if first or last:
            self.names = [f"{name}.{p}" for name in split.tied for p, _ in model.get_submodule(name).named_parameters()]
        self.is_copy = last and not first  # the last stage's copies: left out of the gradient norm

    def copy_from_first(self, model: nn.Module) -> None:
        """Give the last stage the first stage's values (before TP and FSDP: whole tensors)."""
        with torch.no_grad():
            for name in self.names:
                dist.broadcast(model.get_parameter(name).data, src=self.source, group=self.group)

    def sum_gradients(self, model: nn.Module) -> None:
        """Each copy's gradient becomes the sum of both stages' (the copies shard alike, so local shards match)."""
        for name in self.names:
            param = model.get_parameter(name)
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(_local(param.grad), group=self.group)

    def copies(self, model: nn.Module) -> list[nn.Parameter]:
        """The parameters this rank holds as copies of the first stage's (on the last stage): the gradient norm counts
        them on the first."""
        return [model.get_parameter(name) for name in self.names] if self.is_copy else []
