"""Row permutations of the token copies: permute_rows equals indexing, sum_copies is its adjoint."""

from __future__ import annotations

import pytest
import torch

from longboat.models.moe.permute import invert_permutation, permute_rows, sum_copies


@pytest.mark.parametrize("copies", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_permute_rows_equals_indexing_forward_and_backward(copies, dtype):
    torch.manual_seed(0)
    x = torch.randn(10, 6, dtype=dtype)
    order = torch.randperm(10 * copies)
    inverse = invert_permutation(order)
    assert torch.equal(order[inverse], torch.arange(10 * copies))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = permute_rows(xa, order, inverse, copies), xb[order // copies]
    assert torch.equal(ya, yb)
    assert torch.equal(permute_rows(ya, inverse, order), xb.repeat_interleave(copies, 0))  # and back
    grad = torch.randn_like(ya)
    ya.backward(grad)
    yb.backward(grad)
    # Each row's copies are summed in another order than the scatter-add's, and bf16 rounds once, not per add.
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(xa.grad, xb.grad, **tol)


@pytest.mark.parametrize("copies", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sum_copies_is_the_adjoint_of_permute_rows(copies, dtype):
    """sum_copies puts permuted copies back and sums each row's in fp32, rounded once to the input's dtype; its
    gradient spreads them again. Sums of a few bf16 values often fall halfway between two bf16 numbers: those
    round to even, as one rounding of the fp32 sum does."""
    torch.manual_seed(0)
    order = torch.randperm(10 * copies)
    inverse = invert_permutation(order)
    ya = (100 * torch.randn(10 * copies, 64)).to(dtype).requires_grad_()
    yb = ya.detach().clone().requires_grad_()
    out = sum_copies(ya, order, inverse, copies)
    ref = yb[inverse].view(10, copies, 64).float().sum(1).to(dtype)
    assert out.dtype == dtype and torch.equal(out, ref)
    grad = torch.randn(10, 64, dtype=dtype)
    out.backward(grad)
    ref.backward(grad)
    assert ya.grad.dtype == dtype and torch.equal(ya.grad, yb.grad)
    # <permute_rows(x), y> = <x, sum_copies(y)>: one is the other's transpose
    x, y = torch.randn(10, 6), torch.randn(10 * copies, 6)
    torch.testing.assert_close((permute_rows(x, order, inverse, copies) * y).sum(),
                               (x * sum_copies(y, order, inverse, copies)).sum(), atol=1e-5, rtol=1e-5)
