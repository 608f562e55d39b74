"""What the engine asks of a model beyond ``forward``, declared by its ``ModelSpec.hooks``: the auxiliary losses of
the last forward, a hook after each optimizer step, and which modules are expert sets and how they are sharded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn


@dataclass(frozen=True)
class ExpertSets:
    """The modules of a model that expert parallelism splits by expert, and what distributed applies to them.

    ``is_expert_set(module)``: whether ``module`` is one set of routed experts; ``n_experts(module)``: how many it
    holds; ``parallel_style()``: the style that shards one set over an ``ep`` (or ``ep × tp``) mesh;
    ``reads_local_shards(module)``: whether the module's forward swaps in its local shards (then it runs eagerly).
    """

    is_expert_set: Callable[[nn.Module], bool]
    n_experts: Callable[[nn.Module], int]
    parallel_style: Callable[[], Any]
    reads_local_shards: Callable[[nn.Module], bool]

    def modules(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.modules() if self.is_expert_set(m)]


@dataclass(frozen=True)
class ModelHooks:
    """A model family's answers to the engine; None: the family has none.

    ``aux(model)``: the auxiliary losses and metrics of the model's last forward (``loss``, and what the task
    reports), or None when that forward added none; ``after_optimizer_step(model, dp_group)``: run after every
    optimizer step, outside the gradient; ``experts``: the expert sets expert and tensor parallelism shard.
    """

    aux: Callable[[nn.Module], dict | None] | None = None
    after_optimizer_step: Callable[[nn.Module, Any], None] | None = None
    experts: ExpertSets | None = None


NO_HOOKS = ModelHooks()
