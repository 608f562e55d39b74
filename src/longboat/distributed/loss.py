"""What a task hands the trainer: a loss function and its output. It sits below the trainer because the pipeline
schedule splits the loss and returns its output too; a module of its own, so tasks and configs load without the
trainer's checkpointing and distributed machinery."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


@dataclass
class LossOutput:
    loss_sum: torch.Tensor  # sum of per-item losses in the micro-batch
    count: torch.Tensor | int  # items the sum is over (non-ignored tokens, samples, ...)
    units: int  # inputs processed, for throughput (tokens for LMs, samples for policies)
    metrics: dict[str, float] | None = None  # extra floats to log, averaged over the step's micro-batches (all ranks')
    # The micro-batch's weight in that average (e.g. the pairs its per-pair means are over); None: every micro-batch
    # weighs the same.
    metrics_weight: float | None = None


class LossFn(Protocol):
    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput: ...


class StagedLoss(LossFn, Protocol):
    """A loss a pipeline can split between its stages: the model's inputs (every stage gets the keyword ones),
    the loss on the last stage's output, and the part that the auxiliary losses of a model's layers add (MoE
    routers: the spec's ``ModelHooks.aux``), which each stage adds for its own layers."""

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> tuple[tuple, dict]: ...
    def output_loss(self, output: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput: ...
    def aux_loss(self, aux: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> LossOutput: ...


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel wrapper (FSDP2 keeps the model's own class)."""
    return getattr(model, "module", model)
