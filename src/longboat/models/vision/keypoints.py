"""Learned keypoints of a feature map: where things are, which pooling throws away."""

from __future__ import annotations

import torch
from torch import nn


class SpatialSoftmax(nn.Module):
    """Learned keypoints of a feature map (Levine et al., 2016): a 1x1 convolution proposes ``keypoints`` heat
    maps, a softmax over each map's positions turns it into a distribution, and its expected (x, y) in [-1, 1]
    is the keypoint. [N, C, H, W] -> [N, keypoints, 2]."""

    def __init__(self, channels: int, keypoints: int):
        super().__init__()
        self.proj = nn.Conv2d(channels, keypoints, kernel_size=1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        maps = self.proj(features)
        n, k, h, w = maps.shape
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h, device=maps.device, dtype=maps.dtype),
                                torch.linspace(-1, 1, w, device=maps.device, dtype=maps.dtype), indexing="ij")
        grid = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)  # [H*W, 2]
        attention = torch.softmax(maps.reshape(n, k, h * w), dim=-1)
        return attention @ grid
