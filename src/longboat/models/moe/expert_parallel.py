"""Expert parallel: each rank of the ``ep`` axis holds ``n_experts / ep`` routed experts; tokens travel to them
and back by all-to-all.

The MoE family's spec hands this style to ``longboat.distributed`` (``ModelHooks.experts``), which applies it to
every ``GroupedExperts``: its weights become DTensors sharded on dim 0 (the
expert dim) over the ``ep`` mesh, so checkpoints reshard to any other layout, and its ``forward(x, counts)`` is
wrapped. The MoE layer keeps routing its own tokens, dropping what exceeds capacity and sorting the rest by
expert exactly as in one process; the wrapper then

1. exchanges the per-expert counts (an all-to-all of ``[ep, n_local]`` integers), which gives every rank the
   split sizes,
2. sends each rank the rows of its experts and their routing weights (``all_to_all_single``, differentiable, so
   gradients come back the same way),
3. regroups the received rows (source-major) expert-major and runs the unchanged grouped matmul on the local
   weights,
4. sends the outputs back and restores the caller's row order; dropped rows (past ``counts.sum()``) come out as
   zeros, as without expert parallel.

Under tensor parallel as well, the mesh is ``ep × tp``: each expert's ffn units are split over tp too
(``models/moe/tensor_parallel.py``), and the ranks of one tp index exchange tokens among themselves.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from longboat.models.moe.experts import GroupedExperts
from longboat.models.moe.permute import invert_permutation, permute_rows
from longboat.models.moe.tensor_parallel import EXPERT_FFN_DIMS, local_parameters, set_local_shard_forward


def expert_major_order(received: Tensor, total: int | None = None) -> Tensor:
    """Rows received from ``ep`` ranks arrive source-major: ``received[s, e]`` rows from rank s for local expert e.
    The permutation that puts them expert-major (expert 0's rows from every source, then expert 1's, ...),
    keeping each source's row order."""
    ep, n_local = received.shape
    block = torch.arange(n_local, device=received.device) * ep + torch.arange(ep, device=received.device)[:, None]
    # The row count, when the caller knows it, spares repeat_interleave a device sync to find it.
    key = torch.repeat_interleave(block.reshape(-1), received.reshape(-1), output_size=total)
    return torch.argsort(key, stable=True)


def dispatch_and_combine(forward: Callable[..., Tensor], x: Tensor, counts: Tensor,
                         group: dist.ProcessGroup, ep: int, scale: Tensor | None = None) -> Tensor:
    """Run ``forward`` (the local experts) on the rows of ``x`` [S, d] routed to them from every rank of ``group``.

    ``x`` is sorted by global expert with ``counts`` [E] rows each; experts ``[r·E/ep, (r+1)·E/ep)`` live on rank r.
    Each row's ``scale`` [S] (its routing weight), when given, travels with it.
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
    if scale is not None:  # a second, small exchange: fp32 weights would lose precision packed beside bf16 rows
        scale = all_to_all_single_autograd(scale[:n_kept].unsqueeze(-1).contiguous(), recv_splits, send_splits, group)
        scale = permute_rows(scale, order, inverse).view(-1)
    # Every received row belongs to a local expert: the experts need not zero a tail.
    y = forward(permute_rows(rows, order, inverse), received.sum(0), dropless=True, scale=scale)
    y = permute_rows(y, inverse, order)
    back = all_to_all_single_autograd(y.contiguous(), send_splits, recv_splits, group)
    return torch.cat([back, back.new_zeros(x.shape[0] - n_kept, back.shape[1])])


class ExpertParallel(ParallelStyle):
    """Shard a ``GroupedExperts`` over an ``ep`` mesh (every parameter on dim 0, the expert dim) with an all-to-all
    around forward, or over an ``ep × tp`` mesh, which also splits each expert's ffn units over tp: then each tp
    rank sends its (identical, gathered) tokens to the ep ranks of its own tp index and returns a partial sum, which
    the MoE layer's tensor-parallel boundary reduces."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, GroupedExperts):
            raise TypeError(f"ExpertParallel applies to GroupedExperts, not {type(module).__name__}")
        ep_mesh = device_mesh["ep"] if device_mesh.ndim > 1 else device_mesh
        ep = ep_mesh.size()
        for name, param in list(module.named_parameters(recurse=False)):
            placements = [Shard(0)] if device_mesh.ndim == 1 else [Shard(0), Shard(EXPERT_FFN_DIMS[name])]
            # Every rank built the same full weights; each keeps its own slice without communicating.
            shard = distribute_tensor(param.data, device_mesh, placements, src_data_rank=None)
            module.register_parameter(name, nn.Parameter(shard, requires_grad=param.requires_grad))
        # forward's own bookkeeping (the padded path's buffer) counts the experts this rank holds.
        module.n_experts //= ep
        local_forward = module.forward

        def forward(x: Tensor, counts: Tensor, dropless: bool = False, scale: Tensor | None = None) -> Tensor:
            # The rows this rank keeps are sent whole (dropped ones come back as zeros), so dropless changes nothing.
            # A local expert's gradient already sums the tokens of the whole ep group (the all-to-all's backward
            # brings them); FSDP then averages it over the dp / ep ranks that hold the same experts. Scaling by
            # 1 / ep turns that into the average over all dp ranks, which every other weight gets.
            with local_parameters(module, grad_scale=1.0 / ep):
                return dispatch_and_combine(local_forward, x, counts, ep_mesh.get_group(), ep, scale)

        set_local_shard_forward(module, forward)
        return module

