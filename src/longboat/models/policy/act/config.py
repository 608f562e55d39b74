"""ACT's config: the transformer, the CVAE latent and the camera backbone, on top of the policy features."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from longboat.models.policy.base import PolicyConfig
from longboat.models.vision import ResNetConfig


class ACTConfig(PolicyConfig):
    """Action Chunking with Transformers (Zhao et al., 2023).

    The defaults are the ``default`` preset: ACT's layout (4 encoder layers, 1 decoder layer, a 32-d latent,
    KL weight 10, a ResNet-18-shaped backbone) at half its width (d_model 256), so it trains on a CPU.
    """

    horizon: int = Field(default=50, gt=0, description="actions predicted per call (ACT's chunk size)")
    d_model: int = Field(default=256, gt=0, description="width of every token (a multiple of 4 and of n_heads)")
    n_heads: int = Field(default=8, gt=0)
    ffn_dim: int = Field(default=1024, gt=0)
    n_encoder_layers: int = Field(default=4, gt=0)
    # The original code builds 7 decoder layers but reads the first one's output only (LeRobot keeps 1).
    n_decoder_layers: int = Field(default=1, gt=0)
    n_vae_encoder_layers: int = Field(default=4, gt=0, description="layers of the CVAE encoder (training only)")
    latent_dim: int = Field(default=32, gt=0)
    kl_weight: float = Field(default=10.0, ge=0)
    dropout: float = Field(default=0.0, ge=0, lt=1,
                           description="0 keeps training a function of the sample keys (dropout masks are not keyed)")
    norm_eps: float = Field(default=1e-5, gt=0)
    pre_norm: bool = Field(default=False, description="layer norm before each sub-layer (and after each encoder "
                           "stack) instead of after each residual sum, as ACT's pre_norm")
    activation: Literal["relu", "gelu"] = Field(default="relu", description="of the feed-forward layers")
    use_vae: bool = Field(default=True, description="train with the CVAE encoder and its KL term; False: the "
                          "latent is always zero and the policy is a plain L1 regressor")
    positions_2d: Literal["split", "interleaved"] = Field(
        default="split", description="layout of the image tokens' sine positions: split (sines, then cosines, of "
        "each axis) or interleaved (sine and cosine of each frequency side by side, with DETR's 1e-6 in the "
        "normaliser, as DETR, the original ACT and LeRobot)")
    backbone: ResNetConfig = Field(default_factory=ResNetConfig,
                                   description="shared by every camera; in_channels comes from image_features")

    @field_validator("n_obs_steps")
    @classmethod
    def _one_frame(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"ACT reads the current frame only; set n_obs_steps to 1, got {v}")
        return v

    @model_validator(mode="after")
    def _check_act(self) -> ACTConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.d_model % 4:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of 4 (2-D sinusoidal positions)")
        channels = {shape[0] for shape in self.image_features.values()}
        if len(channels) > 1:
            raise ValueError(f"image_features: the cameras share one backbone, so they need one channel count, "
                             f"got {sorted(channels)}")
        if self.action_dim and not self.image_features and self.state_feature is None:
            raise ValueError("ACT needs an observation: image_features is empty and state_feature is null")
        return self

    @property
    def image_channels(self) -> int:
        return next(iter(self.image_features.values()))[0] if self.image_features else self.backbone.in_channels
