"""A ResNet image backbone (He et al., 2016) returning the last feature map, for policies' camera inputs.

Basic blocks only (ResNet-18/34 shapes). Normalisation is GroupNorm by default: batch statistics would tie a
sample's features to its batch mates, which breaks data-parallel equivalence and small-batch training (Diffusion
Policy makes the same swap); ``norm: batch`` keeps the original for users who want it, and ``norm: frozen_batch``
is batch norm with fixed statistics and affine terms (torchvision's ``FrozenBatchNorm2d``, as DETR and ACT build
their backbones): a per-channel affine map, so samples stay independent.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from longboat.config.base import StrictModel


class ResNetConfig(StrictModel):
    in_channels: int = Field(default=3, gt=0)
    widths: list[int] = Field(default=[64, 128, 256, 512], min_length=1, description="channels of each stage")
    blocks: list[int] = Field(default=[2, 2, 2, 2], min_length=1, description="basic blocks per stage")
    norm: Literal["group", "batch", "frozen_batch"] = "group"
    groups: int = Field(default=16, gt=0, description="GroupNorm groups (each width must divide by it)")
    group_size: int | None = Field(default=None, gt=0, description="channels per GroupNorm group, overriding "
                                   "groups (16: torchvision-style GroupNorm(C // 16, C), as Diffusion Policy builds)")
    stem_stride: int = Field(default=4, ge=1, description="4: 7x7/2 convolution then 3x3/2 max pool, as ResNet")

    @property
    def out_channels(self) -> int:
        return self.widths[-1]

    @property
    def stride(self) -> int:
        """Input pixels per feature-map cell along each axis."""
        return self.stem_stride * 2 ** (len(self.widths) - 1)


class FrozenBatchNorm2d(nn.Module):
    """Batch norm in evaluation form whose statistics and affine terms are buffers, never trained: ``x * scale +
    shift`` with ``scale = weight / sqrt(running_var + eps)``, computed as torchvision does (same rounding)."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(channels))
        self.register_buffer("bias", torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def reset_parameters(self) -> None:
        for name, value in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
            getattr(self, name).fill_(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight.reshape(1, -1, 1, 1) * (self.running_var.reshape(1, -1, 1, 1) + self.eps).rsqrt()
        shift = self.bias.reshape(1, -1, 1, 1) - self.running_mean.reshape(1, -1, 1, 1) * scale
        return x * scale + shift


def _norm(cfg: ResNetConfig, channels: int) -> nn.Module:
    if cfg.norm == "frozen_batch":
        return FrozenBatchNorm2d(channels)
    if cfg.norm == "batch":
        return nn.BatchNorm2d(channels)
    if cfg.group_size is not None:
        if channels % cfg.group_size:
            raise ValueError(f"width {channels} is not divisible by group_size={cfg.group_size}")
        return nn.GroupNorm(channels // cfg.group_size, channels)
    if channels % cfg.groups:
        raise ValueError(f"width {channels} is not divisible by groups={cfg.groups}")
    return nn.GroupNorm(cfg.groups, channels)


class BasicBlock(nn.Module):
    def __init__(self, cfg: ResNetConfig, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = _norm(cfg, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = _norm(cfg, cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(cfg, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(self.norm2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """[B, C, H, W] images -> [B, widths[-1], H / stride, W / stride] features."""

    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        if len(cfg.widths) != len(cfg.blocks):
            raise ValueError(f"widths {cfg.widths} and blocks {cfg.blocks} must have the same length")
        if cfg.stem_stride not in (1, 2, 4):
            raise ValueError(f"stem_stride must be 1, 2 or 4, got {cfg.stem_stride}")
        self.cfg = cfg
        first = cfg.widths[0]
        stem: list[nn.Module] = [nn.Conv2d(cfg.in_channels, first, 7 if cfg.stem_stride > 1 else 3,
                                           2 if cfg.stem_stride > 1 else 1, 3 if cfg.stem_stride > 1 else 1,
                                           bias=False), _norm(cfg, first), nn.ReLU()]
        if cfg.stem_stride == 4:
            stem.append(nn.MaxPool2d(3, 2, 1))
        self.stem = nn.Sequential(*stem)
        stages, cin = [], first
        for i, (width, n) in enumerate(zip(cfg.widths, cfg.blocks)):
            blocks = [BasicBlock(cfg, cin if j == 0 else width, width, 2 if (j == 0 and i > 0) else 1)
                      for j in range(n)]
            stages.append(nn.Sequential(*blocks))
            cin = width
        self.stages = nn.ModuleList(stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return x
