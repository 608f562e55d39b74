"""The language-model loss that pretraining and fine-tuning share: summed next-token cross-entropy."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from longboat.data.labels import IGNORE_INDEX
from longboat.distributed.loss import LossOutput, unwrap
from longboat.models.registry import hooks_of


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


class LMLoss:
    """Summed next-token cross-entropy over pre-shifted labels (``IGNORE_INDEX`` skipped), plus MoE aux losses
    in training; see ``make_lm_loss``. A pipeline calls its parts on different stages: ``model_inputs`` on every
    stage, ``output_loss`` on the last one's logits and ``aux_loss`` on each stage's own MoE layers."""

    def __init__(self, use_position_ids: bool, use_segments: bool = False, per_sample: bool = False,
                 extra_inputs: Callable[[dict], dict] | None = None):
        self.use_position_ids, self.use_segments, self.per_sample = use_position_ids, use_segments, per_sample
        self.extra_inputs = extra_inputs

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> tuple[tuple, dict]:
        # Default positions (0..T-1) are computed inside the model; pass ids only when they reset per document.
        kwargs = {}
        if self.use_position_ids:
            kwargs["positions"] = batch["position_ids"]
        if self.use_segments:
            kwargs["segments"] = batch["segments"]
        if self.extra_inputs is not None:  # the spec's ModelHooks.model_inputs
            kwargs.update(self.extra_inputs(batch))
        return (batch["tokens"],), kwargs

    def output_loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> LossOutput:
        """The cross-entropy part of the micro-batch's loss (without the model's aux losses)."""
        labels = batch["labels"]
        segments = self._segments(batch)
        units = int((segments > 0).sum()) if self.use_segments else labels.numel()
        if self.per_sample:
            loss_sum, count = _per_sample_loss(logits, labels, segments)
        else:
            loss_sum = F.cross_entropy(
                logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
            )
            count = (labels != IGNORE_INDEX).sum()
        return LossOutput(loss_sum, count, units)

    def aux_loss(self, aux: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> LossOutput:
        """The part of the micro-batch's loss that MoE aux losses ``aux`` (the spec's ``ModelHooks.aux``) add: their
        weighted sum times the micro-batch's count, with their load statistics as metrics (and no units)."""
        labels = batch["labels"]
        if self.per_sample:
            count = _sample_ids(labels, self._segments(batch)).unique().numel()
        else:
            count = (labels != IGNORE_INDEX).sum()
        return LossOutput(aux["loss"] * count, count, 0, moe_metrics(aux))

    def _segments(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        return batch["segments"] if self.use_segments else None

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        args, kwargs = self.model_inputs(batch)
        out = self.output_loss(model(*args, **kwargs), batch)
        aux_of = hooks_of(unwrap(model)).aux
        aux = aux_of(unwrap(model)) if aux_of is not None and model.training else None
        if aux is None:
            return out
        part = self.aux_loss(aux, batch)
        return LossOutput(out.loss_sum + part.loss_sum, out.count, out.units, part.metrics)


def make_lm_loss(use_position_ids: bool, use_segments: bool = False, per_sample: bool = False,
                 extra_inputs: Callable[[dict], dict] | None = None) -> LMLoss:
    """Summed next-token cross-entropy over pre-shifted labels (``IGNORE_INDEX`` skipped), plus MoE aux losses
    in training.

    The trainer divides the sum by the global count, so by default the loss is the mean over supervised tokens.
    ``per_sample``: each sample (a segment of a packed row, else a row) contributes the mean over its own
    tokens and the count is the number of samples, so long and short samples weigh the same.
    ``use_segments``: the batch's ``segments`` [B, T] (packed documents, 0 for padding) keep attention within
    each document, and throughput counts the non-padding tokens.
    The aux loss enters as ``aux * local_count``: after normalisation it is the count-weighted mean of the
    micro-batches' aux losses. ``extra_inputs(batch)``: keyword inputs the model takes besides those (the spec's
    ``ModelHooks.model_inputs``).
    """
    return LMLoss(use_position_ids, use_segments, per_sample, extra_inputs)


def _sample_ids(labels: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
    """The sample (a segment of a packed row, else a row) of each supervised label, as ``row * n_ids + segment``."""
    if segments is None:
        segments = torch.ones_like(labels)
    rows = torch.arange(labels.shape[0], device=labels.device)[:, None]
    return (rows * (int(segments.max()) + 1) + segments)[labels != IGNORE_INDEX]


def _per_sample_loss(
    logits: torch.Tensor, labels: torch.Tensor, segments: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over samples of each sample's mean token loss, number of samples with a supervised token)."""
    B, T = labels.shape
    token_loss = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(B, T)
    n_ids = int(segments.max()) + 1 if segments is not None else 2
    sample = _sample_ids(labels, segments)
    sums = token_loss.new_zeros(B * n_ids).index_add_(0, sample, token_loss[labels != IGNORE_INDEX])
    counts = torch.bincount(sample, minlength=B * n_ids)
    has = counts > 0
    return (sums[has] / counts[has]).sum(), has.sum()
