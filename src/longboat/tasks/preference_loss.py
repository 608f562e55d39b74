"""Preference losses on sequence log-probabilities, and the loss function that computes them from packed pairs.

The formulas are those users know from TRL (``DPOTrainer``'s ``sigmoid``, ``hinge``, ``ipo`` and ``robust`` losses,
``CPOTrainer``'s SimPO), on the summed log-probability of each answer's tokens:

- ``dpo``: −log σ(β·Δ), Δ = (log π(c) − log π_ref(c)) − (log π(r) − log π_ref(r));
- ``hinge``: max(0, 1 − β·Δ);
- ``ipo``: (Δ̄ − 1/(2β))², Δ̄ the same difference of per-token averages;
- ``robust``: ((1 − ε)·(−log σ(β·Δ)) + ε·log σ(−β·Δ)) / (1 − 2ε), ε = ``label_smoothing``;
- ``simpo``: no reference; −(1 − ε)·log σ(β·m) − ε·log σ(−β·m), m = (avg log π(c) − avg log π(r)) − γ/β.

A pair's loss may add ``sft_weight`` × the mean negative log-likelihood of the chosen answer's tokens; a model's
auxiliary losses (MoE routers' balance, the spec's ``ModelHooks.aux``) are added in training as the LM loss adds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.nn.functional as F

from longboat.data.labels import IGNORE_INDEX
from longboat.distributed.loss import LossOutput, unwrap
from longboat.models.registry import hooks_of

LossKind = Literal["dpo", "ipo", "hinge", "robust", "simpo"]
REFERENCE_FREE = ("simpo",)


@dataclass
class PairLogps:
    """Per pair of a micro-batch, in ascending pair id: summed log-probabilities and answer lengths in tokens."""

    ids: torch.Tensor  # [P] pair ids
    chosen: torch.Tensor  # [P]
    rejected: torch.Tensor  # [P]
    chosen_tokens: torch.Tensor  # [P]
    rejected_tokens: torch.Tensor  # [P]


def pair_logps(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> PairLogps:
    """Summed log-probabilities of each answer's supervised tokens; a segment's parity says which answer it is
    (odd: chosen, even: rejected), ``pair_ids`` whose pair it is."""
    labels = batch["labels"]
    token_logps = -F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX,
                                   reduction="none")
    supervised = labels.flatten() != IGNORE_INDEX
    pairs = batch["pair_ids"].flatten()[supervised]
    rejected = (batch["segments"].flatten()[supervised] % 2 == 0).long()
    ids, local = torch.unique(pairs, return_inverse=True)
    slot = local * 2 + rejected
    sums = token_logps.new_zeros(2 * len(ids)).index_add_(0, slot, token_logps[supervised])
    counts = torch.bincount(slot, minlength=2 * len(ids))
    sums, counts = sums.view(-1, 2), counts.view(-1, 2)
    return PairLogps(ids, sums[:, 0], sums[:, 1], counts[:, 0], counts[:, 1])


def preference_losses(kind: LossKind, beta: float, policy: PairLogps, reference: torch.Tensor | None,
                      label_smoothing: float = 0.0, simpo_gamma: float = 0.5) -> tuple[torch.Tensor, dict]:
    """Each pair's loss [P] and the rewards behind it: ``(losses, {"chosen", "rejected"})`` (β times the log-ratio
    to the reference; SimPO's are β times the average log-probability). ``reference``: [P, 2] (chosen, rejected)."""
    if kind == "simpo":
        chosen = policy.chosen / policy.chosen_tokens.clamp(min=1)
        rejected = policy.rejected / policy.rejected_tokens.clamp(min=1)
        margin = chosen - rejected - simpo_gamma / beta
        losses = (-(1 - label_smoothing) * F.logsigmoid(beta * margin)
                  - label_smoothing * F.logsigmoid(-beta * margin))
        return losses, {"chosen": beta * chosen.detach(), "rejected": beta * rejected.detach()}
    chosen = policy.chosen - reference[:, 0]
    rejected = policy.rejected - reference[:, 1]
    delta = chosen - rejected
    if kind == "dpo":
        losses = -F.logsigmoid(beta * delta)
    elif kind == "hinge":
        losses = torch.relu(1 - beta * delta)
    elif kind == "ipo":
        average = chosen / policy.chosen_tokens.clamp(min=1) - rejected / policy.rejected_tokens.clamp(min=1)
        losses = (average - 1 / (2 * beta)) ** 2
    elif kind == "robust":
        losses = ((1 - label_smoothing) * -F.logsigmoid(beta * delta)
                  + label_smoothing * F.logsigmoid(-beta * delta)) / (1 - 2 * label_smoothing)
    else:
        raise ValueError(f"unknown preference loss {kind!r}")
    return losses, {"chosen": beta * chosen.detach(), "rejected": beta * rejected.detach()}


class PreferenceLoss:
    """The trainer's loss function for packed pairs: one forward of the policy, the reference's log-probabilities
    from ``reference(model, batch, policy)`` ([P, 2]; None for SimPO), the mean loss over pairs, and the metrics
    under the names users know (``rewards/chosen``, ``rewards/accuracies``, ``logps/rejected``, ...)."""

    def __init__(self, kind: LossKind, beta: float, label_smoothing: float, simpo_gamma: float, sft_weight: float,
                 reference: Callable[[torch.nn.Module, dict, PairLogps], torch.Tensor] | None,
                 extra_inputs: Callable[[dict], dict] | None = None):
        self.kind, self.beta, self.label_smoothing = kind, beta, label_smoothing
        self.simpo_gamma, self.sft_weight = simpo_gamma, sft_weight
        self.reference, self.extra_inputs = reference, extra_inputs

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> tuple[tuple, dict]:
        kwargs = {"positions": batch["position_ids"], "segments": batch["segments"]}
        if self.extra_inputs is not None:
            kwargs.update(self.extra_inputs(batch))
        return (batch["tokens"],), kwargs

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        args, kwargs = self.model_inputs(batch)
        policy = pair_logps(model(*args, **kwargs), batch)
        reference = self.reference(model, batch, policy) if self.reference is not None else None
        losses, rewards = preference_losses(self.kind, self.beta, policy, reference, self.label_smoothing,
                                            self.simpo_gamma)
        if self.sft_weight:
            losses = losses - self.sft_weight * policy.chosen / policy.chosen_tokens.clamp(min=1)
        margins = rewards["chosen"] - rewards["rejected"]
        metrics = {
            "rewards/chosen": rewards["chosen"].mean(), "rewards/rejected": rewards["rejected"].mean(),
            "rewards/accuracies": (margins > 0).float().mean(), "rewards/margins": margins.mean(),
            "logps/chosen": policy.chosen.detach().mean(), "logps/rejected": policy.rejected.detach().mean(),
        }
        loss_sum = losses.sum()
        aux_of = hooks_of(unwrap(model)).aux
        aux = aux_of(unwrap(model)) if aux_of is not None and model.training else None
        if aux is not None:  # e.g. MoE routers' balance losses, weighted per pair as the LM loss weighs per token
            loss_sum = loss_sum + aux["loss"] * len(policy.ids)
            metrics["aux_loss"] = aux["loss"].detach()
        # The metrics are per-pair means: weighted by the pairs, a step's metric is the mean over all its pairs.
        return LossOutput(loss_sum, len(policy.ids), len(policy.ids), metrics, metrics_weight=len(policy.ids))
