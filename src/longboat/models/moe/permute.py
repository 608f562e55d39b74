"""Row permutations with gather-only gradients.

Indexing ``x[idx]`` differentiates into a scatter-add (``index_put`` with accumulation), which runs serially on
CPU and needs atomics on GPU. When ``idx`` comes from a permutation its inverse is known, and the gradient is a
plain gather instead. (On CPU the two scatter-adds took 3% of a MoE layer's fp32 forward+backward, ``bench/moe.py``
under the profiler.) The gathers are ``index_select``: on CPU it copies whole rows, where ``x[idx]`` (advanced
indexing) goes element by element, about 5 times slower for 1024-wide fp32 rows.

The two operations here are each other's adjoint: ``permute_rows`` spreads each row into its copies, in a permuted
order; ``sum_copies`` puts the copies back and sums each row's. Each one's backward is the other's forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def invert_permutation(order: Tensor) -> Tensor:
    """inverse[order[i]] = i."""
    return torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))


def _spread(x: Tensor, order: Tensor, copies: int) -> Tensor:
    return x.index_select(0, order // copies if copies > 1 else order)


def _gather_sum(y: Tensor, inverse: Tensor, copies: int) -> Tensor:
    if copies == 1:
        return y.index_select(0, inverse)
    # Copy j of row r is number r * copies + j: each row's copies are summed in a fixed order.
    if y.dtype == torch.float32 and y.dim() == 2:
        # One pass, without the gathered [rows * copies, d] intermediate.
        return F.embedding_bag(inverse.view(-1, copies), y.contiguous(), mode="sum")
    # Half precision sums in fp32 and rounds once (CPU's embedding_bag would round bf16 ties away from zero).
    grouped = y.index_select(0, inverse).view(-1, copies, *y.shape[1:])
    if copies == 2:  # one add, the same rounding: CPU reduces a dimension of two several times slower
        return torch.add(grouped[:, 0], grouped[:, 1])
    return grouped.sum(1)


class _PermuteRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, order: Tensor, inverse: Tensor, copies: int) -> Tensor:
        ctx.save_for_backward(inverse)
        ctx.copies = copies
        return _spread(x, order, copies)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        (inverse,) = ctx.saved_tensors
        return _gather_sum(grad, inverse, ctx.copies), None, None, None


class _SumCopies(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: Tensor, order: Tensor, inverse: Tensor, copies: int) -> Tensor:
        ctx.save_for_backward(order)
        ctx.copies = copies
        return _gather_sum(y, inverse, copies)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        (order,) = ctx.saved_tensors
        return _spread(grad, order, ctx.copies), None, None, None


def permute_rows(x: Tensor, order: Tensor, inverse: Tensor, copies: int = 1) -> Tensor:
    """Rows ``x[order[i] // copies]``, where ``order`` permutes the ``x.shape[0] * copies`` row copies (copy j of
    row r is number ``r * copies + j``) and ``inverse = invert_permutation(order)``.

    ``permute_rows(y, inverse, order)`` puts the rows back.
    """
    return _PermuteRows.apply(x, order, inverse, copies)


def sum_copies(y: Tensor, order: Tensor, inverse: Tensor, copies: int) -> Tensor:
    """The adjoint of ``permute_rows(x, order, inverse, copies)``: ``y``'s rows put back in copy order and each
    original row's ``copies`` summed in a fixed order, in fp32 rounded once to y's dtype -> [y.shape[0] // copies, ...].
    """
    return _SumCopies.apply(y, order, inverse, copies)
