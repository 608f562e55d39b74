"""What a task adds to the training loop. Every hook has a default that leaves the loop as it is."""

from __future__ import annotations

import torch


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

    def eval_metrics(self, loss: float, metrics: dict[str, float]) -> dict[str, float]:
        """Evaluation results from the mean loss and the mean of the loss function's metrics."""
        return {"loss": loss, **metrics}
