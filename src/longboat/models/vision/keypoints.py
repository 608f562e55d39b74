"""Learned keypoints of a feature map: where things are, which pooling throws away."""

from __future__ import annotations

import math

import torch
from torch import nn


class SpatialSoftmax(nn.Module):
    """Learned keypoints of a feature map (Levine et al., 2016): a 1x1 convolution proposes ``keypoints`` heat
    maps, a softmax over each map's positions turns it into a distribution, and its expected (x, y) in [-1, 1]
    is the keypoint. [N, C, H, W] -> [N, keypoints, 2].

    With ``normalize``, each heat map is standardised over its positions and scaled by a learned per-keypoint
    sharpness before the softmax. Raw maps of a small encoder at default initialisation have tiny logits, so over a
    large map the softmax stays almost uniform and every keypoint sits at the centre whatever the image shows
    (measured: a coordinate's spread over an episode of 6e-7); standardised maps start peaked enough to move."""

    def __init__(self, channels: int, keypoints: int, normalize: bool = False, sharpness: float = 2.0):
        super().__init__()
        self.proj = nn.Conv2d(channels, keypoints, kernel_size=1)
        self.sharpness_init = sharpness
        self.log_sharpness = nn.Parameter(torch.empty(keypoints)) if normalize else None
        self.reset_parameters()

    def reset_parameters(self) -> None:  # its own parameter only: ``proj`` resets itself
        if self.log_sharpness is not None:
            nn.init.constant_(self.log_sharpness, math.log(self.sharpness_init))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        maps = self.proj(features)
        n, k, h, w = maps.shape
        logits = maps.reshape(n, k, h * w)
        if self.log_sharpness is not None:
            mean, std = logits.mean(-1, keepdim=True), logits.std(-1, keepdim=True)
            logits = (logits - mean) / (std + 1e-5) * self.log_sharpness.exp()[:, None]
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h, device=maps.device, dtype=maps.dtype),
                                torch.linspace(-1, 1, w, device=maps.device, dtype=maps.dtype), indexing="ij")
        grid = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)  # [H*W, 2]
        attention = torch.softmax(logits, dim=-1)
        return attention @ grid
