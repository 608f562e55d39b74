"""The policy contract: what every robot policy (ACT, diffusion, flow VLA, ...) is to the engine.

A policy is a plain ``nn.Module`` registered as a model architecture. Its config extends ``PolicyConfig``, whose
feature fields the policy task fills from the dataset (``configure_model``); the policy's own hyper-parameters
(``horizon``, ``n_obs_steps``, widths) come from its preset and the user.

Batches, training and inference alike, are already transformed (normalised, resized, padded) and keyed like
LeRobot, always with a time axis:

- ``observation.images.<cam>``: float [B, n_obs_steps, C, H, W]; ``observation.state``: float [B, n_obs_steps, S]
- ``action``: float [B, horizon, A] and ``action_is_pad``: bool [B, horizon] (training only)
- ``noise_key``: int64 [B], the key of every random draw of the sample (``keyed_random``); ``task``: the prompts
  (a list of B strings), and ``prompt_tokens``/``prompt_mask`` [B, L] where the policy reads a tokenizer.

``forward(batch)`` returns per-sample training losses (the task sums them; the trainer divides by the global
sample count); ``predict(obs)`` maps an observation batch to an action chunk [B, horizon, A] in the model's
(normalised) units, which the transform pipeline maps back to robot units.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field, model_validator
from torch import nn

from longboat.config.base import StrictModel


class PolicyConfig(StrictModel):
    """Features (filled from the dataset by the policy task) and the window every policy declares."""

    image_features: dict[str, list[int]] = Field(
        default_factory=dict, description="camera key -> [C, H, W] as the model sees it (after the transforms)")
    state_feature: str | None = Field(default="observation.state", description="None: the policy reads no state")
    state_dim: int = Field(default=0, ge=0)
    action_feature: str = "action"
    action_dim: int = Field(default=0, ge=0, description="0 until the task fills it from the dataset")
    horizon: int = Field(default=16, gt=0, description="actions predicted per call (the action chunk)")
    n_obs_steps: int = Field(default=1, gt=0, description="observation frames per call, the current one last")

    @model_validator(mode="after")
    def _check_features(self):
        for key, shape in self.image_features.items():
            if len(shape) != 3 or min(shape) <= 0:
                raise ValueError(f"image_features.{key}: expected [C, H, W], got {shape}")
        if self.state_feature is not None and self.state_dim == 0 and self.action_dim > 0:
            raise ValueError("state_dim is 0 but state_feature is set; set state_feature: null for no state")
        return self


def observation_keys(cfg: PolicyConfig) -> list[str]:
    """The dataset features a policy observes: its cameras, then its state."""
    return [*cfg.image_features, *([cfg.state_feature] if cfg.state_feature is not None else [])]


class Policy(nn.Module):
    """Base of every policy: ``forward`` is the training loss, ``predict`` the action chunk."""

    #: the batch keys ``predict`` reads besides the features (e.g. ``prompt_tokens``)
    extra_inputs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.cfg = cfg

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """``{"loss": [B] per-sample losses, <metric>: [B] per-sample values to log}``.

        Training goes through ``forward`` so that DDP and FSDP2 see the call (their hooks sit on it)."""
        raise NotImplementedError

    def param_groups(self) -> dict[str, tuple[list[str], float]] | None:
        """component -> (parameter names, learning-rate scale) for per-component learning rates; parameters in no
        group are frozen. None: every parameter trains at the base rate."""
        return None

    @torch.no_grad()
    def predict(self, obs: dict, noise_key: torch.Tensor | None = None) -> torch.Tensor:
        """The action chunk [B, horizon, action_dim] for an observation batch (normalised units). Random policies
        draw from ``noise_key`` [B] when given (reproducible), else from torch's global generator."""
        raise NotImplementedError
