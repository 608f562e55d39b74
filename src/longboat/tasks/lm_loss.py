"""The language-model loss that pretraining and fine-tuning share: summed next-token cross-entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longboat.data.labels import IGNORE_INDEX
from longboat.trainer.trainer import LossFn, LossOutput, unwrap


def moe_metrics(aux: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Load-balance statistics of one forward: the worst layer's busiest and idlest expert relative to the
    mean load (1 and 1 when balanced) and the fraction of routed token copies dropped by capacity."""
    load = aux["load"]  # [n_moe_layers, n_experts]
    mean = load.mean(dim=1).clamp(min=1e-9)
    return {
        "moe_aux_loss": aux["loss"].detach(),
        "moe_load_max": (load.max(dim=1).values / mean).max(),
        "moe_load_min": (load.min(dim=1).values / mean).min(),
        "moe_dropped": aux["dropped"].sum() / load.sum().clamp(min=1),
    }


def make_lm_loss(use_position_ids: bool) -> LossFn:
    """Summed next-token cross-entropy over pre-shifted labels (``IGNORE_INDEX`` skipped), plus MoE aux losses
    in training.

    The trainer divides the sum by the global token count, so the aux loss enters as ``aux * local_count``:
    after normalisation it is the token-weighted mean of the micro-batches' aux losses.
    """

    def lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        # Default positions (0..T-1) are computed inside the model; pass ids only when they reset at EOD.
        logits = model(batch["tokens"], batch["position_ids"] if use_position_ids else None)
        labels = batch["labels"]
        loss_sum = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        count = (labels != IGNORE_INDEX).sum()
        moe_aux = getattr(unwrap(model), "moe_aux", None)
        aux = moe_aux() if moe_aux is not None and model.training else None
        if aux is None:
            return LossOutput(loss_sum, count, labels.numel())
        return LossOutput(loss_sum + aux["loss"] * count, count, labels.numel(), moe_metrics(aux))

    return lm_loss
