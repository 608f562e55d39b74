"""A behaviour-cloning MLP: the plain baseline every other policy must beat.

The observation window (state of every step, one feature vector per camera and step: pooled, or keypoints) is
flattened, an MLP maps it to the whole action chunk, and the loss is L1 (or MSE) over the chunk's real steps
(``action_is_pad`` masks the steps past an episode's end). Deterministic: ``predict`` ignores ``noise_key``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from longboat.models.policy.base import Policy
from longboat.models.policy.mlp.config import MLPPolicyConfig
from longboat.models.vision import SpatialSoftmax


class CameraEncoder(nn.Module):
    """[N, C, H, W] -> [N, features]. Pooled: two strided convolutions and a global average pool (what is in
    view, ``channels`` features). Keypoints: a strided and two unstrided convolutions keep half the resolution,
    and a spatial softmax over standardised heat maps gives ``keypoints`` (x, y) positions (where it is,
    ``2 * keypoints`` features)."""

    def __init__(self, in_channels: int, channels: int, keypoints: int | None = None):
        super().__init__()
        strides = (2, 2) if keypoints is None else (2, 1, 1)
        widths = (in_channels,) + (channels,) * len(strides)
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, stride=s, padding=1)
                                   for a, b, s in zip(widths[:-1], widths[1:], strides))
        self.keypoints = None if keypoints is None else SpatialSoftmax(channels, keypoints, normalize=True)
        self.out_dim = channels if keypoints is None else 2 * keypoints

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images
        for conv in self.convs:
            x = F.gelu(conv(x))
        return x.mean(dim=(-2, -1)) if self.keypoints is None else self.keypoints(x).flatten(1)


class Block(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.linear = nn.Linear(dim_in, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x))


class MLPPolicy(Policy):
    def __init__(self, cfg: MLPPolicyConfig):
        super().__init__(cfg)
        self.cfg: MLPPolicyConfig = cfg
        self.cameras = sorted(cfg.image_features)
        # ModuleDict keys may not hold dots, which feature names do: cameras are numbered in sorted order.
        self.encoders = nn.ModuleList(CameraEncoder(cfg.image_features[k][0], cfg.image_channels, cfg.image_keypoints)
                                      for k in self.cameras)
        dim_in = cfg.n_obs_steps * (cfg.state_dim + sum(e.out_dim for e in self.encoders))
        dims = [dim_in] + [cfg.hidden_dim] * cfg.n_layers
        self.blocks = nn.ModuleList(Block(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(cfg.hidden_dim, cfg.horizon * cfg.action_dim)

    def init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d, SpatialSoftmax)):
                m.reset_parameters()

    def _actions(self, obs: dict) -> torch.Tensor:
        cfg = self.cfg
        parts = []
        if cfg.state_feature is not None:
            parts.append(obs[cfg.state_feature].flatten(1))  # [B, T * S]
        for key, encoder in zip(self.cameras, self.encoders):
            images = obs[key]  # [B, T, C, H, W]
            parts.append(encoder(images.flatten(0, 1)).view(images.shape[0], -1))
        x = torch.cat(parts, dim=-1)
        for block in self.blocks:
            x = block(x)
        return self.head(x).view(-1, cfg.horizon, cfg.action_dim)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        pred = self._actions(batch).float()
        target = batch[self.cfg.action_feature].float()
        error = (pred - target).abs() if self.cfg.loss == "l1" else (pred - target).square()
        real = (~batch["action_is_pad"]).float()  # [B, H]
        steps = real.sum(-1).clamp(min=1)
        loss = (error.mean(-1) * real).sum(-1) / steps
        return {"loss": loss}

    @torch.no_grad()
    def predict(self, obs: dict, noise_key: torch.Tensor | None = None) -> torch.Tensor:
        return self._actions(obs)
