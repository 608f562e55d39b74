"""Gradient norm and clipping over parameters that live on different device meshes and pipeline stages."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Collection, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate


def _local_and_copies(grad: torch.Tensor, stage_ranks: int) -> tuple[torch.Tensor, int]:
    """This rank's part of ``grad``, and how many of its stage's ranks hold that same part."""
    if not isinstance(grad, DTensor):
        return grad, stage_ranks  # plain tensors are whole on every rank (one process, DDP)
    if any(p.is_partial() for p in grad.placements):  # a sum still pending: make it whole first
        grad = grad.redistribute(placements=[Replicate() if p.is_partial() else p for p in grad.placements])
    mesh = grad.device_mesh
    replicated = math.prod(mesh.size(i) for i, p in enumerate(grad.placements) if p.is_replicate())
    # Each slice of the stage's ranks shaped like the mesh holds the whole tensor, and each replicated mesh
    # dimension repeats a part within a slice.
    return grad.to_local(), max(1, stage_ranks // mesh.size()) * replicated


@torch.no_grad()
def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float, stage_ranks: int = 1,
                   counted_elsewhere: Collection[nn.Parameter] = ()) -> torch.Tensor:
    """Scale the gradients down to a total L2 norm of at most ``max_norm``; returns the norm before (a plain
    tensor, the same on every rank).

    ``stage_ranks`` is how many ranks hold this rank's pipeline stage (the world size without pipelining), sharded
    or replicated over meshes of any shape: tensor-parallel weights on ``dp_shard × tp`` beside the weights every tp
    rank replicates (MoE routers, MLA's latent projections) on ``dp_shard`` alone, expert-parallel experts on
    ``dp_shard / ep × ep`` (``× tp``). Each rank adds the squares of its local gradients, each divided by how many
    ranks hold the same part, and one all-reduce over the world sums every part of every stage once: one collective a
    step whatever the layout (reducing mesh by mesh took one or two per mesh and per pipeline stage).
    ``counted_elsewhere`` are gradients another rank already counts (a tied weight's copy on the last pipeline
    stage): clipped, not counted.
    """
    params = list(params)
    skip = {id(p) for p in counted_elsewhere}
    grads, by_copies = [], defaultdict(list)
    for p in params:
        if p.grad is None:
            continue
        grads.append(p.grad)
        if id(p) not in skip:
            local, copies = _local_and_copies(p.grad, stage_ranks)
            by_copies[copies].append(local)
    device = params[0].device if params else torch.device("cpu")  # the backend's (NCCL: the rank's GPU)
    squared = torch.zeros((), dtype=torch.float64, device=device)
    for copies, locals_ in by_copies.items():
        squared += torch.nn.utils.get_total_norm(locals_).double().square() / copies
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(squared)
    total = squared.sqrt().float()
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total
