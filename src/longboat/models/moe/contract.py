"""The MoE layer's answers for ``ModelHooks.experts``: its ``GroupedExperts`` are the expert sets, sharded by
``ExpertParallel``; DTensor's styles load on first use only."""

from __future__ import annotations

from torch import nn

from longboat.models.contracts import ExpertSets
from longboat.models.moe.experts import GroupedExperts


def _is_expert_set(module: nn.Module) -> bool:
    return isinstance(module, GroupedExperts)


def _n_experts(module: nn.Module) -> int:
    return module.n_experts


def _parallel_style():
    from longboat.models.moe.expert_parallel import ExpertParallel

    return ExpertParallel()


def _reads_local_shards(module: nn.Module) -> bool:
    from longboat.models.moe.tensor_parallel import reads_local_shards

    return reads_local_shards(module)


MOE_EXPERTS = ExpertSets(_is_expert_set, _n_experts, _parallel_style, _reads_local_shards)
