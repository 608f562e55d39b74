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


def make_lm_loss(use_position_ids: bool, use_segments: bool = False, per_sample: bool = False) -> LossFn:
    """Summed next-token cross-entropy over pre-shifted labels (``IGNORE_INDEX`` skipped), plus MoE aux losses
    in training.

    The trainer divides the sum by the global count, so by default the loss is the mean over supervised tokens.
    ``per_sample``: each sample (a segment of a packed row, else a row) contributes the mean over its own
    tokens and the count is the number of samples, so long and short samples weigh the same.
    ``use_segments``: the batch's ``segments`` [B, T] (packed documents, 0 for padding) keep attention within
    each document, and throughput counts the non-padding tokens.
    The aux loss enters as ``aux * local_count``: after normalisation it is the count-weighted mean of the
    micro-batches' aux losses.
    """

    def lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        # Default positions (0..T-1) are computed inside the model; pass ids only when they reset per document.
        positions = batch["position_ids"] if use_position_ids else None
        segments = batch["segments"] if use_segments else None
        logits = model(batch["tokens"], positions) if segments is None else model(batch["tokens"], positions,
                                                                                  None, segments)
        labels = batch["labels"]
        units = int((segments > 0).sum()) if segments is not None else labels.numel()
        if per_sample:
            loss_sum, count = _per_sample_loss(logits, labels, segments)
        else:
            loss_sum = F.cross_entropy(
                logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
            )
            count = (labels != IGNORE_INDEX).sum()
        moe_aux = getattr(unwrap(model), "moe_aux", None)
        aux = moe_aux() if moe_aux is not None and model.training else None
        if aux is None:
            return LossOutput(loss_sum, count, units)
        return LossOutput(loss_sum + aux["loss"] * count, count, units, moe_metrics(aux))

    return lm_loss


def _per_sample_loss(
    logits: torch.Tensor, labels: torch.Tensor, segments: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over samples of each sample's mean token loss, number of samples with a supervised token)."""
    B, T = labels.shape
    token_loss = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(B, T)
    if segments is None:
        segments = torch.ones_like(labels)
    n_ids = int(segments.max()) + 1
    valid = labels != IGNORE_INDEX
    sample = (torch.arange(B, device=labels.device)[:, None] * n_ids + segments)[valid]
    sums = token_loss.new_zeros(B * n_ids).index_add_(0, sample, token_loss[valid])
    counts = torch.bincount(sample, minlength=B * n_ids)
    has = counts > 0
    return (sums[has] / counts[has]).sum(), has.sum()
