"""The behaviour-cloning MLP's hyper-parameters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from longboat.models.policy.base import PolicyConfig


class MLPPolicyConfig(PolicyConfig):
    """State (and a small conv encoder per camera) -> an MLP -> the whole action chunk at once."""

    hidden_dim: int = Field(default=256, gt=0)
    n_layers: int = Field(default=2, gt=0, description="hidden layers (Linear + GELU) of the MLP")
    image_channels: int = Field(default=16, gt=0, description="width of each camera's conv encoder")
    image_keypoints: int | None = Field(
        default=None, gt=0,
        description="learned keypoints (spatial softmax) per camera instead of average pooling: positions, which "
                    "manipulation from pixels needs",
    )
    loss: Literal["l1", "mse"] = "l1"
