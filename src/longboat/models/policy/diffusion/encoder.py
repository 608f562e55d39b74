"""Observation encoder: camera frames and robot state over the observation window -> one conditioning vector."""

from __future__ import annotations

import torch
from torch import nn

from longboat.models.policy.diffusion.config import DiffusionConfig
from longboat.models.vision import ResNet, SpatialSoftmax


class CameraEncoder(nn.Module):
    """One camera's frames [N, C, H, W] -> features [N, image_feature_dim]: ResNet, spatial softmax, linear."""

    def __init__(self, cfg: DiffusionConfig, channels: int):
        super().__init__()
        vision = cfg.vision.model_copy(update={"in_channels": channels})
        self.backbone = ResNet(vision)
        self.keypoints = SpatialSoftmax(vision.out_channels, cfg.keypoints)
        self.out = nn.Linear(2 * cfg.keypoints, cfg.image_feature_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.out(self.keypoints(self.backbone(images)).flatten(1)))


class ObservationEncoder(nn.Module):
    """The global conditioning of the U-Net: per observation step the state and every camera's features,
    concatenated over the ``n_obs_steps`` frames. A separate encoder per camera, as the paper, or one shared by all
    (``shared_camera_encoder``, as LeRobot builds it)."""

    def __init__(self, cfg: DiffusionConfig):
        super().__init__()
        self.cfg = cfg
        self.camera_keys = sorted(cfg.image_features)
        n = 1 if cfg.shared_camera_encoder and self.camera_keys else len(self.camera_keys)
        self.cameras = nn.ModuleList(CameraEncoder(cfg, cfg.image_features[k][0]) for k in self.camera_keys[:n])

    @property
    def out_dim(self) -> int:
        state = self.cfg.state_dim if self.cfg.state_feature is not None else 0
        return self.cfg.n_obs_steps * (state + len(self.camera_keys) * self.cfg.image_feature_dim)

    def forward(self, obs: dict) -> torch.Tensor:
        parts = []
        if self.cfg.state_feature is not None:
            parts.append(obs[self.cfg.state_feature])  # [B, n_obs, S]
        for i, key in enumerate(self.camera_keys):
            encoder = self.cameras[0 if self.cfg.shared_camera_encoder else i]
            frames = obs[key]  # [B, n_obs, C, H, W]
            b, t = frames.shape[:2]
            parts.append(encoder(frames.flatten(0, 1)).reshape(b, t, -1))
        return torch.cat(parts, dim=-1).flatten(1)
