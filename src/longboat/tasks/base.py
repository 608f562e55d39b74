"""Tasks: what a training step computes and what the data implies. One class per task, registered by name.

A task is built from its validated data config. Before the model exists it may fill model fields its data
determines (``configure_model``); it then builds the datasets and the loss, and may name parameter groups
(per-component learning rates; parameters in no group are frozen), keep state in checkpoints, shape evaluation
metrics, name its throughput unit and declare the files every export carries (``TrainerHooks`` and below).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from torch import nn
from torch.utils.data import Dataset

from longboat.config.base import ConfigError, StrictModel
from longboat.distributed.loss import LossFn
from longboat.trainer.hooks import TrainerHooks
from longboat.trainer.optim import ParamGroup
from longboat.utils.registry import Registry


@dataclass
class TaskData:
    train: Dataset
    valid: Dataset | None
    loss_fn: LossFn
    summary: dict = field(default_factory=dict)  # shown once at start, e.g. sample counts


class Task(TrainerHooks):
    name: ClassVar[str]
    data_config: ClassVar[type[StrictModel]]
    #: the config class every model this task trains derives from (None: any architecture)
    model_config: ClassVar[type[StrictModel] | None] = None
    #: the task's defaults for the run's ``train:`` section (e.g. EMA on), merged under what the user sets
    train_defaults: ClassVar[dict] = {}

    def __init__(self, data: StrictModel):
        self.data = data

    @classmethod
    def check_architecture(cls, config: type[StrictModel]) -> None:
        """Refuse an architecture (by its config class) whose models this task cannot train, before its fields are
        filled or validated; ``model_config`` already requires a base class where one is set."""

    def configure_model(self, fields: dict) -> dict:
        """The model config's fields (a preset merged with the user's) completed from the data, before
        validation. Use ``fill_from_data``; a value the user set that disagrees with the data is an error."""
        return fields

    def check(self, model_cfg: StrictModel) -> None:
        """Check the data against the model (files readable, sizes and ranges fit) before anything is written;
        ``longboat train --check`` runs this too."""

    def build(self, model_cfg: StrictModel, train_cfg: Any, seed: int, dp_size: int) -> TaskData:
        raise NotImplementedError

    def flops_per_unit(self, model_cfg: StrictModel) -> float | None:
        """Training FLOPs per throughput unit, for MFU; None where unknown."""
        return None

    def param_groups(self, model: nn.Module) -> list[ParamGroup] | None:
        """Groups of the plain model's parameters by name; None: every parameter in one default group."""
        return None

    def export_assets(self) -> dict[str, Path | bytes]:
        """Files every export of this task carries: name -> a file to copy, or the bytes to write."""
        return {}


def fill_from_data(fields: dict, found: dict[str, Any], source: str) -> dict:
    """``fields`` with each key of ``found`` set; a different value already there is an error naming both."""
    out = dict(fields)
    for key, value in found.items():
        if key in out and out[key] is not None and out[key] != value:
            raise ConfigError(f"model.{key}={out[key]!r} disagrees with the data ({source} has {value!r}); "
                              f"drop model.{key} to take it from the data")
        out[key] = value
    return out


_TASKS: Registry[type[Task]] = Registry("task", "known tasks", ConfigError)


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: the task ``name`` (a run config's ``task:``)."""
    def wrap(cls: type[Task]) -> type[Task]:
        _TASKS.register(name, cls)
        cls.name = name
        return cls

    return wrap


def get_task(name: str) -> type[Task]:
    return _TASKS.get(name)


def task_names() -> list[str]:
    return _TASKS.names()
