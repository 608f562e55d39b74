"""Gradient norm and clipping over parameters that live on different device meshes."""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor


@torch.no_grad()
def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float,
                   across: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Scale the gradients down to a total L2 norm of at most ``max_norm``; returns the norm before (a plain tensor).

    ``across`` turns this rank's norm into the whole model's where other ranks hold other parameters (pipeline
    stages).

    torch's ``clip_grad_norm_`` stacks every gradient's norm into one tensor, which fails once DTensors sit on
    different meshes: tensor-parallel weights on ``dp_shard × tp`` beside the weights every tp rank replicates (MoE
    routers, MLA's latent projections) on ``dp_shard`` alone, and expert-parallel experts on ``dp_shard / ep × ep``
    (``× tp``). Each mesh's norm is made whole first.
    """
    grads = [p.grad for p in params if p.grad is not None]
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for g in grads:  # parameters() has the same order on every rank, so the collectives below line up
        by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
    if across is not None:
        total = across(total)
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total
