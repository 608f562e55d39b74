"""Diffusion Policy's hyper-parameters (Chi et al., 2023); defaults are the paper's CNN-based variant."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from longboat.models.policy.base import PolicyConfig
from longboat.models.vision import ResNetConfig


class DiffusionConfig(PolicyConfig):
    """Observation encoder, conditional 1-D U-Net and noise schedule of a Diffusion Policy.

    ``clip_sample`` bounds the denoised actions to ±``clip_sample_range``, which assumes the actions are
    normalised to [-1, 1] (min/max normalisation); with mean/std normalisation turn it off.
    """

    n_obs_steps: int = Field(default=2, gt=0, description="observation frames per call, the current one last")

    # Observation encoder: per camera a ResNet (in_channels comes from the camera's shape), a spatial softmax
    # over learned keypoints and a linear layer.
    vision: ResNetConfig = ResNetConfig()
    keypoints: int = Field(default=32, gt=0, description="spatial-softmax keypoints per camera")
    image_feature_dim: int = Field(default=64, gt=0, description="features per camera and frame")
    shared_camera_encoder: bool = Field(default=False, description="one encoder for every camera (LeRobot's "
                                        "default) instead of one per camera (the paper's)")

    # Noise-prediction network: a 1-D temporal U-Net over the action horizon with FiLM conditioning.
    down_dims: list[int] = Field(default=[512, 1024, 2048], min_length=1,
                                 description="channels of each U-Net level; the horizon halves between levels")
    kernel_size: int = Field(default=5, gt=0)
    n_groups: int = Field(default=8, gt=0, description="GroupNorm groups of the U-Net's conv blocks")
    step_embed_dim: int = Field(default=128, gt=0, description="width of the diffusion-step embedding")
    film_scale: bool = Field(default=True, description="FiLM with a scale and a bias (False: bias only)")
    final_n_groups: int | None = Field(default=None, gt=0, description="GroupNorm groups of the output conv block; "
                                       "null: n_groups (LeRobot's keeps 8 whatever n_groups)")

    # Noise schedule: DDPM training on the squared-cosine schedule, DDIM sampling (eta 0) at inference.
    train_timesteps: int = Field(default=100, gt=1)
    inference_steps: int = Field(default=10, gt=0, description="DDIM steps per action chunk")
    prediction: Literal["epsilon", "sample"] = Field(default="epsilon", description="what the U-Net predicts")
    clip_sample: bool = Field(default=True, description="clip the predicted clean actions (needs min/max "
                              "normalised actions)")
    clip_sample_range: float = Field(default=1.0, gt=0)
    mask_padding: bool = Field(default=False, description="leave actions past the episode end (action_is_pad) "
                               "out of the loss")
    sampler: Literal["ddim", "ddpm"] = Field(default="ddim", description="ddim: deterministic steps (eta 0); ddpm: "
                                             "ancestral steps adding keyed noise")
    beta_schedule: Literal["squaredcos_cap_v2", "linear"] = "squaredcos_cap_v2"
    spacing: Literal["trailing", "leading"] = Field(default="trailing", description="inference timesteps from "
                                                    "T - 1 down (trailing) or multiples of T // steps (leading, "
                                                    "diffusers' default)")
    float32_tables: bool = Field(default=False, description="the schedule's tables in float32, as diffusers")
    first_action: int = Field(default=0, ge=0, description="predict returns the denoised chunk from this step: "
                              "n_obs_steps - 1 starts at the current step, as LeRobot's Diffusion Policy acts")

    @model_validator(mode="after")
    def _check_shapes(self):
        levels = len(self.down_dims) - 1
        if self.horizon % 2**levels:
            raise ValueError(f"horizon {self.horizon} must be divisible by 2^{levels} (the U-Net halves it "
                             f"between the {len(self.down_dims)} down_dims levels)")
        if any(d % self.n_groups for d in self.down_dims):
            raise ValueError(f"down_dims {self.down_dims} must each be divisible by n_groups={self.n_groups}")
        if self.step_embed_dim % 2 or self.step_embed_dim < 4:
            raise ValueError(f"step_embed_dim must be even and at least 4 (sines and cosines), "
                             f"got {self.step_embed_dim}")
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd (same-length convolutions), got {self.kernel_size}")
        if self.first_action >= self.horizon:
            raise ValueError(f"first_action {self.first_action} must be below the horizon {self.horizon}")
        if self.inference_steps > self.train_timesteps:
            raise ValueError(f"inference_steps {self.inference_steps} exceeds train_timesteps {self.train_timesteps}")
        if self.action_dim and not self.image_features and self.state_feature is None:
            raise ValueError("the policy sees nothing: set image_features or state_feature")
        return self
