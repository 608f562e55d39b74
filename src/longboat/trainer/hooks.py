"""What a task adds to the training loop. Every hook has a default that leaves the loop as it is."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

if TYPE_CHECKING:
    from longboat.trainer.trainer import DataParallel


class TrainerHooks:
    """Base of every task: the trainer calls these and knows nothing else about the task."""

    #: what ``LossOutput.units`` counts: throughput is logged as ``<unit>_per_s``
    unit: str = "samples"
    #: read the training data in reshuffled epochs (finite datasets) instead of in its own order
    epochs: bool = False

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors saved in every checkpoint (e.g. normalisation statistics); empty: nothing saved."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what ``state_dict`` returned, when resuming."""

    def before_training(self, model: nn.Module, run_dir: Path, device: torch.device, dp: DataParallel,
                        resumed: bool, replica: Callable[[], nn.Module] | None = None) -> None:
        """Once the model holds its starting weights (or a resumed checkpoint's), before the first step; every rank
        calls it, so it may run the (sharded) model, e.g. to precompute a frozen reference's outputs.
        ``replica()`` builds another model as the trained one was built and sharded (weights as initialised), e.g.
        for a frozen copy; None where the run cannot make one (pipeline stages)."""

    def eval_metrics(self, loss: float, metrics: dict[str, float]) -> dict[str, float]:
        """Evaluation results from the mean loss and the mean of the loss function's metrics."""
        return {"loss": loss, **metrics}
