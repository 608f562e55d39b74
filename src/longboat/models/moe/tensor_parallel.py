"""Tensor-parallel styles for the MoE layer: every expert split along its ffn dimension (Megatron's expert tensor
parallel), so each of the ``tp`` ranks computes ``1 / tp`` of every expert on the whole gathered sequence.

Inside the layer all tp ranks hold the same tokens and route them identically, and the experts (routed and shared)
give partial sums of the output. The layer's output is reduce-scattered onto the sequence; the gradient of its input,
a partial sum too, is reduce-scattered back. What stays replicated inside the layer (the router, a shared-expert gate)
has to fit that: the gradient it receives from the partial sums is summed over tp first (so its weights get the whole
gradient, the same on every rank), and the gradient it passes to the input is divided by tp (so that summing the
input's gradient over tp counts it once).

Only ``longboat.distributed`` applies these styles (the decoder's plan names them); the layer stays plain PyTorch:
its experts' forward reads the local shards through ``local_parameters``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle


# The dimension of each GroupedExperts weight that indexes the ffn units (w13 [E, 2, ffn, d], w2 [E, d, ffn]).
EXPERT_FFN_DIMS = {"w13": 2, "w2": 2}


class ScaleGradient(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``scale``."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


def reads_local_shards(module: nn.Module) -> bool:
    """Whether ``module``'s forward swaps in its local shards (``FFNSharded``, expert parallel): a compiled graph
    cannot hold that swap, so such modules run eagerly between the graphs of their neighbours."""
    return getattr(module, "_reads_local_shards", False)


def set_local_shard_forward(module: nn.Module, forward: Callable[..., Any]) -> None:
    """Replace ``module``'s forward by one that swaps in its local shards, and mark it so (``reads_local_shards``)."""
    module.forward = forward
    module._reads_local_shards = True


@contextlib.contextmanager
def local_parameters(module: nn.Module, grad_scale: float = 1.0) -> Iterator[None]:
    """Let the forward of ``module`` (and its submodules) read their DTensor parameters as this rank's shards.

    An instance attribute shadows ``nn.Module.__getattr__``'s parameter lookup, so the plain forward sees local
    tensors while the registered parameters stay DTensors for FSDP, the optimizer and checkpoints; ``to_local``
    carries the gradient back to the DTensor, multiplied by ``grad_scale``.
    """
    shadowed = [(owner, name) for owner in module.modules()
                for name, p in owner._parameters.items() if isinstance(p, DTensor)]
    for owner, name in shadowed:
        local = owner._parameters[name].to_local()
        owner.__dict__[name] = local if grad_scale == 1.0 else ScaleGradient.apply(local, grad_scale)
    try:
        yield
    finally:
        for owner, name in shadowed:
            owner.__dict__.pop(name, None)


def sum_gradient_over(mesh: DeviceMesh, x: Tensor) -> Tensor:
    """Identity forward; the gradient (a partial sum on each rank) is all-reduced over ``mesh``."""
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


class PartialSumLayer(ParallelStyle):
    """The MoE layer's boundary: its input [B, T/tp, d] is gathered over the sequence, and its output ``(y, aux)``,
    a partial sum on each rank, is reduce-scattered back onto it. The input's gradient is a partial sum as well, so
    its backward is a reduce-scatter, not a slice."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def gather(_: nn.Module, args: tuple) -> tuple:
            x = args[0]  # a DTensor from a sequence-parallel norm, or its local shard
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, device_mesh, [Shard(1)], run_check=False)
            return (x.redistribute(device_mesh, [Replicate()]).to_local(grad_placements=[Partial()]), *args[1:])

        def reduce_scatter(_: nn.Module, args: tuple, out: tuple) -> tuple:
            y = DTensor.from_local(out[0], device_mesh, [Partial()], run_check=False)
            return (y.redistribute(device_mesh, [Shard(1)]).to_local(), *out[1:])

        module.register_forward_pre_hook(gather)
        module.register_forward_hook(reduce_scatter)
        return module


class ReplicatedInPartialSum(ParallelStyle):
    """A module every tp rank runs identically inside the layer (a router, a gate): the gradient reaching its output
    (``output_field`` of a named-tuple output) is summed over tp, the one it sends to its input divided by tp."""

    def __init__(self, output_field: str | None = None) -> None:
        super().__init__()
        self.output_field = output_field

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        scale = 1.0 / device_mesh.size()
        field = self.output_field

        def scale_input(_: nn.Module, args: tuple) -> tuple:
            return (ScaleGradient.apply(args[0], scale), *args[1:])

        def sum_output(_: nn.Module, args: tuple, out: Any) -> Any:
            if field is None:
                return sum_gradient_over(device_mesh, out)
            return out._replace(**{field: sum_gradient_over(device_mesh, getattr(out, field))})

        module.register_forward_pre_hook(scale_input)
        module.register_forward_hook(sum_output)
        return module


class FFNSharded(ParallelStyle):
    """Split a feed-forward's weights along their ffn dimension over the tp mesh and run its plain forward on the
    local shards; its output is then this rank's partial sum. ``dims`` maps each (dotted) parameter name to the
    dimension that indexes the ffn units (``w13``'s shard holds the gate and the up rows of the same units)."""

    def __init__(self, dims: dict[str, int]) -> None:
        super().__init__()
        self.dims = dims

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for path, dim in self.dims.items():
            owner_path, _, name = path.rpartition(".")
            owner = module.get_submodule(owner_path)
            param = owner._parameters[name]
            # Every rank built the same full weights; each keeps its slice without communicating.
            shard = distribute_tensor(param.data, device_mesh, [Shard(dim)], src_data_rank=None)
            owner.register_parameter(name, nn.Parameter(shard, requires_grad=param.requires_grad))
        plain_forward = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            with local_parameters(module):
                return plain_forward(*args, **kwargs)

        set_local_shard_forward(module, forward)
        return module


def moe_layer_plan(prefix: str, shared_experts: bool, shared_gate: bool) -> dict[str, ParallelStyle]:
    """The plan entries of one MoE layer at ``prefix``."""
    plan: dict[str, ParallelStyle] = {
        prefix: PartialSumLayer(),
        f"{prefix}.router": ReplicatedInPartialSum("weights"),
        f"{prefix}.experts": FFNSharded(EXPERT_FFN_DIMS),
    }
    if shared_experts:
        plan[f"{prefix}.shared_experts"] = FFNSharded({"w1.weight": 0, "w3.weight": 0, "w2.weight": 1})
    if shared_gate:
        plan[f"{prefix}.shared_gate"] = ReplicatedInPartialSum()
    return plan
