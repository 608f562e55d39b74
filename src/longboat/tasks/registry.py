"""Task registry: a task builds the data and the loss for the trainer; nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from longboat.config.base import ConfigError, StrictModel
from longboat.trainer.trainer import LossFn


@dataclass
class TaskParts:
    train: Dataset
    valid: Dataset | None
    loss_fn: LossFn
    flops_per_unit: float | None = None
    tokenizer_dir: Path | None = None
    summary: dict = field(default_factory=dict)
    # Called by the trainer after each optimizer step with (model, data-parallel group), e.g. MoE bias updates.
    after_step: Callable[[nn.Module, dist.ProcessGroup | None], None] | None = None


@dataclass
class TaskSpec:
    name: str
    data_config: type[StrictModel]
    build: Callable[..., TaskParts]


_TASKS: dict[str, TaskSpec] = {}


def register_task(name: str, data_config: type[StrictModel]):
    def wrap(fn: Callable[..., TaskParts]) -> Callable[..., TaskParts]:
        if name in _TASKS:
            raise ValueError(f"task '{name}' registered twice")
        _TASKS[name] = TaskSpec(name, data_config, fn)
        return fn

    return wrap


def get_task(name: str) -> TaskSpec:
    if name not in _TASKS:
        raise ConfigError(f"unknown task '{name}'; known tasks: {', '.join(sorted(_TASKS))}")
    return _TASKS[name]


def task_names() -> list[str]:
    return sorted(_TASKS)
