"""Model transforms: changes a run makes to the built architecture (LoRA adapters) and folds away in every export.

This module is the one place they are applied, in config order: on the built model before freezing and
parallelism (``build_model``), on what trains (``trainable_groups``, then the run's ``train.param_groups``), on the
weights an export writes (``plain_weights``), on a checkpoint opened as a model (``fold_model``), and on the
records that let a resume refuse a change of them (``transform_records``). Training, preflight, artifacts and
exports call these and never test for a particular transform.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from longboat.trainer.optim import ParamGroup
from longboat.trainer.param_rules import apply_param_rules

if TYPE_CHECKING:
    from longboat.recipes.config import ResolvedRun


class ModelTransform:
    """One transform of a run's model; ``key`` is its section of the run config (and of an export's metadata)."""

    key: str

    def apply(self, model: nn.Module) -> None:
        """Change the freshly built model in place (on any device, the meta device included)."""

    def trainable(self, model: nn.Module, groups: list[ParamGroup] | None) -> list[ParamGroup] | None:
        """The parameter groups that train, given those of the task (None: every parameter, one group)."""
        return groups

    def check_parallel(self, tp: int) -> None:
        """Refuse a parallel layout the transform cannot train under."""

    def fold_model(self, model: nn.Module) -> None:
        """Turn the transformed model back into the plain architecture, in place (weights loaded)."""

    def fold_state(self, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``(the plain architecture's full state dict, the transform's own tensors)`` of a full state dict."""
        return state, {}

    def save_beside(self, run_dir: Path, own: dict[str, torch.Tensor], plain: dict[str, torch.Tensor],
                    resolved: ResolvedRun) -> Path | None:
        """Write the transform's own files next to the run's exports (e.g. a PEFT adapter); the path, or None."""
        return None

    def record(self) -> dict:
        """The settings, as JSON: kept in exports (what was folded in) and compared on resume."""
        raise NotImplementedError

    def describe(self) -> str:
        """A few words for the run's summary line."""
        return self.key


def build_model(resolved: ResolvedRun, device: torch.device | str | None = None) -> nn.Module:
    """The run's model: the architecture built on ``device`` (the meta device allocates nothing), then its
    transforms, before freezing and parallelism, which must see every parameter the run trains."""
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = resolved.spec.build(resolved.model)
        for transform in resolved.transforms:
            transform.apply(model)
    return model


def trainable_groups(resolved: ResolvedRun, model: nn.Module) -> list[ParamGroup] | None:
    """The groups that train: the task's, restricted by each transform, then the run's ``train.param_groups``."""
    groups = resolved.task.param_groups(model)
    for transform in resolved.transforms:
        groups = transform.trainable(model, groups)
    return apply_param_rules(model, groups, resolved.cfg.train.param_groups)


def fold_model(resolved: ResolvedRun, model: nn.Module) -> nn.Module:
    """A loaded transformed model back to the plain architecture, transforms undone in reverse order."""
    for transform in reversed(resolved.transforms):
        transform.fold_model(model)
    return model


def plain_weights(resolved: ResolvedRun, state: dict[str, torch.Tensor], run_dir: Path | None = None
                  ) -> dict[str, torch.Tensor]:
    """The plain architecture's full state dict from the trained model's; with ``run_dir``, each transform also
    writes its own files there (rank 0 only: the caller holds the gathered state)."""
    for transform in reversed(resolved.transforms):
        state, own = transform.fold_state(state)
        if run_dir is not None:
            transform.save_beside(run_dir, own, state, resolved)
    return state


def folded_records(resolved: ResolvedRun) -> dict[str, dict]:
    """Each transform's settings under its key: what an export records as folded into its weights."""
    return {t.key: t.record() for t in resolved.transforms}


def describe_transforms(resolved: ResolvedRun) -> str:
    return "".join(f" · {t.describe()}" for t in resolved.transforms)
