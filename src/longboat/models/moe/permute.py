"""Row permutations with gather-only gradients.

Indexing ``x[idx]`` differentiates into a scatter-add (``index_put`` with accumulation), which runs serially on
CPU and needs atomics on GPU. When ``idx`` comes from a permutation its inverse is known, and the gradient is a
plain gather instead. (On CPU the two scatter-adds took 3% of a MoE layer's fp32 forward+backward, ``bench/moe.py``
under the profiler.)
"""

from __future__ import annotations

import torch
from torch import Tensor


def invert_permutation(order: Tensor) -> Tensor:
    """inverse[order[i]] = i."""
    return torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))


class _PermuteRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, order: Tensor, inverse: Tensor, copies: int) -> Tensor:
        ctx.save_for_backward(inverse)
        ctx.copies = copies
        return x[order // copies] if copies > 1 else x[order]

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        (inverse,) = ctx.saved_tensors
        grad = grad[inverse]
        if ctx.copies > 1:  # copy j of row r is number r * copies + j: sum each row's copies
            grad = grad.view(-1, ctx.copies, *grad.shape[1:]).sum(1)
        return grad, None, None, None


def permute_rows(x: Tensor, order: Tensor, inverse: Tensor, copies: int = 1) -> Tensor:
    """Rows ``x[order[i] // copies]``, where ``order`` permutes the ``x.shape[0] * copies`` row copies (copy j of
    row r is number ``r * copies + j``) and ``inverse = invert_permutation(order)``.

    ``permute_rows(y, inverse, order)`` puts the rows back.
    """
    return _PermuteRows.apply(x, order, inverse, copies)
