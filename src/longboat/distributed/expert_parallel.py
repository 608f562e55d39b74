"""Expert parallel: each rank of the ``ep`` axis holds ``n_experts / ep`` routed experts; tokens travel to them
and back by all-to-all.

Applied from outside the model to every ``GroupedExperts``: its weights become DTensors sharded on dim 0 (the
expert dim) over the ``ep`` mesh, so checkpoints reshard to any other layout, and its ``forward(x, counts)`` is
wrapped. The MoE layer keeps routing its own tokens, dropping what exceeds capacity and sorting the rest by
expert exactly as in one process; the wrapper then

1. exchanges the per-expert counts (an all-to-all of ``[ep, n_local]`` integers), which gives every rank the
   split sizes,
2. sends each rank the rows of its experts (``all_to_all_single``, differentiable, so gradients come back the
   same way),
3. regroups the received rows (source-major) expert-major and runs the unchanged grouped matmul on the local
   weights,
4. sends the outputs back and restores the caller's row order; dropped rows (past ``counts.sum()``) come out as
   zeros, as without expert parallel.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from longboat.distributed.layout_checks import check_expert_parallel, expert_modules
from longboat.models.moe.experts import GroupedExperts
from longboat.models.moe.permute import invert_permutation, permute_rows


def expert_major_order(received: Tensor, total: int | None = None) -> Tensor:
    """Rows received from ``ep`` ranks arrive source-major: ``received[s, e]`` rows from rank s for local expert e.
    The permutation that puts them expert-major (expert 0's rows from every source, then expert 1's, ...),
    keeping each source's row order."""
    ep, n_local = received.shape
    block = torch.arange(n_local, device=received.device) * ep + torch.arange(ep, device=received.device)[:, None]
    # The row count, when the caller knows it, spares repeat_interleave a device sync to find it.
    key = torch.repeat_interleave(block.reshape(-1), received.reshape(-1), output_size=total)
    return torch.argsort(key, stable=True)


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``scale``."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


@contextlib.contextmanager
def _local_weights(module: nn.Module, ep: int) -> Iterator[None]:
    """Let ``module``'s forward read its DTensor parameters as this rank's local shards.

    An instance attribute shadows ``nn.Module.__getattr__``'s parameter lookup, so the plain forward sees local
    tensors while the registered parameters stay DTensors for FSDP, the optimizer and checkpoints; ``to_local``
    carries the gradient back to the DTensor.

    The gradient of a local expert already sums the tokens of the whole ep group (the all-to-all's backward
    brings them); FSDP then averages it over the ``dp / ep`` ranks that hold the same experts. Scaling by
    ``1 / ep`` turns that into the average over all ``dp`` ranks, which every other weight gets.
    """
    shadowed = [name for name, p in module._parameters.items() if isinstance(p, DTensor)]
    for name in shadowed:
        module.__dict__[name] = _ScaleGradient.apply(module._parameters[name].to_local(), 1.0 / ep)
    try:
        yield
    finally:
        for name in shadowed:
            module.__dict__.pop(name, None)


def dispatch_and_combine(forward: Callable[..., Tensor], x: Tensor, counts: Tensor,
                         group: dist.ProcessGroup, ep: int) -> Tensor:
    """Run ``forward`` (the local experts) on the rows of ``x`` [S, d] routed to them from every rank of ``group``.

    ``x`` is sorted by global expert with ``counts`` [E] rows each; experts ``[r·E/ep, (r+1)·E/ep)`` live on rank r.
    """
    n_local = counts.numel() // ep
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    received = received.view(ep, n_local)
    # all_to_all_single takes its split sizes as host integers: one device sync per MoE layer, for both lists.
    send_splits, recv_splits = torch.stack([counts.view(ep, n_local).sum(1), received.sum(1)]).tolist()
    n_kept = sum(send_splits)
    rows = all_to_all_single_autograd(x[:n_kept].contiguous(), recv_splits, send_splits, group)
    order = expert_major_order(received, sum(recv_splits))
    inverse = invert_permutation(order)
    # Every received row belongs to a local expert: the experts need not zero a tail.
    y = permute_rows(forward(permute_rows(rows, order, inverse), received.sum(0), dropless=True), inverse, order)
    back = all_to_all_single_autograd(y.contiguous(), send_splits, recv_splits, group)
    return torch.cat([back, back.new_zeros(x.shape[0] - n_kept, back.shape[1])])


class ExpertParallel(ParallelStyle):
    """Shard a ``GroupedExperts`` over a 1-D ``ep`` mesh: every parameter on dim 0, all-to-all around forward."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, GroupedExperts):
            raise TypeError(f"ExpertParallel applies to GroupedExperts, not {type(module).__name__}")
        ep = device_mesh.size()
        for name, param in list(module.named_parameters(recurse=False)):
            # Every rank built the same full weights; each keeps its own experts without communicating.
            shard = distribute_tensor(param.data, device_mesh, [Shard(0)], src_data_rank=None)
            module.register_parameter(name, nn.Parameter(shard, requires_grad=param.requires_grad))
        # forward's own bookkeeping (the padded path's buffer) counts the experts this rank holds.
        module.n_experts //= ep
        local_forward = module.forward

        def forward(x: Tensor, counts: Tensor, dropless: bool = False) -> Tensor:
            # The rows this rank keeps are sent whole (dropped ones come back as zeros), so dropless changes nothing.
            with _local_weights(module, ep):
                return dispatch_and_combine(local_forward, x, counts, device_mesh.get_group(), ep)

        module.forward = forward
        return module


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Shard every expert set of ``model`` over ``ep_mesh``."""
    check_expert_parallel(model, ep_mesh.size())
    for module in expert_modules(model):
        parallelize_module(module, ep_mesh, ExpertParallel())
