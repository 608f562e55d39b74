"""Gradient clipping across the meshes of a parallelised model."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (2-norm) for gradients that may be DTensors on different meshes.

    torch stacks the per-tensor norms, which DTensors on two meshes refuse; expert parallel puts the experts on
    a mesh of their own. Each mesh's norm is reduced to a plain tensor before the total, which is returned as a
    plain tensor (or a DTensor when every gradient lives on one mesh, as torch returns it).
    """
    params = [p for p in parameters if p.grad is not None]
    by_mesh: dict[object, list[Tensor]] = {}
    for p in params:
        by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p.grad)
    if len(by_mesh) <= 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norms = [torch.nn.utils.get_total_norm(grads) for grads in by_mesh.values()]
    norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]
    total = torch.linalg.vector_norm(torch.stack(norms))
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1:  # as torch: scale only when the norm exceeds max_norm
        for grads in by_mesh.values():
            torch._foreach_mul_(grads, coef)
    return total
