"""Expert parallel: shard every expert set of a model over the ``ep`` (or ``ep × tp``) mesh with the style its spec
declares (``ModelHooks.experts``); the style itself lives with the model family."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module

from longboat.distributed.layout_checks import check_expert_parallel, expert_modules, expert_sets


def apply_expert_parallel(model: nn.Module, mesh: DeviceMesh) -> None:
    """Shard every expert set of ``model`` over ``mesh``: ``ep``, or ``ep × tp`` (``ParallelMesh.expert_split``)."""
    check_expert_parallel(model, (mesh["ep"] if mesh.ndim > 1 else mesh).size())
    sets = expert_sets(model)
    for module in expert_modules(model):
        parallelize_module(module, mesh, sets.parallel_style())
