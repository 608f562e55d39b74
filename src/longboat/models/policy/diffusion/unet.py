"""The noise-prediction network: a 1-D temporal U-Net over the action horizon (Janner et al., 2022), conditioned
by FiLM on the observation features and the diffusion step (Chi et al., 2023)."""

from __future__ import annotations

import math

import torch
from torch import nn

from longboat.models.policy.diffusion.config import DiffusionConfig


class SinusoidalEmbedding(nn.Module):
    """Timesteps [B] -> [B, dim]: sines and cosines at geometrically spaced frequencies (transformer positions)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device) * (-math.log(10000) / (half - 1)))
        angles = t.float()[:, None] * freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


class ConvBlock(nn.Sequential):
    """Conv1d -> GroupNorm -> Mish, keeping the length."""

    def __init__(self, cin: int, cout: int, kernel_size: int, groups: int):
        super().__init__(nn.Conv1d(cin, cout, kernel_size, padding=kernel_size // 2), nn.GroupNorm(groups, cout),
                         nn.Mish())


class ResidualBlock(nn.Module):
    """Two conv blocks with FiLM between them: the conditioning sets a per-channel scale and bias."""

    def __init__(self, cfg: DiffusionConfig, cin: int, cout: int, cond_dim: int):
        super().__init__()
        self.conv1 = ConvBlock(cin, cout, cfg.kernel_size, cfg.n_groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * cout if cfg.film_scale else cout))
        self.conv2 = ConvBlock(cout, cout, cfg.kernel_size, cfg.n_groups)
        self.residual = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()
        self.film_scale = cfg.film_scale

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x)
        film = self.film(cond).unsqueeze(-1)
        if self.film_scale:
            scale, bias = film.chunk(2, dim=1)
            h = scale * h + bias
        else:
            h = h + film
        return self.conv2(h) + self.residual(x)


class DownLevel(nn.Module):
    """Two residual blocks, then halve the length (not on the last level). Returns (output, skip)."""

    def __init__(self, cfg: DiffusionConfig, cin: int, cout: int, cond_dim: int, last: bool):
        super().__init__()
        self.blocks = nn.ModuleList([ResidualBlock(cfg, cin, cout, cond_dim), ResidualBlock(cfg, cout, cout, cond_dim)])
        self.downsample = nn.Identity() if last else nn.Conv1d(cout, cout, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for block in self.blocks:
            x = block(x, cond)
        return self.downsample(x), x


class UpLevel(nn.Module):
    """Concatenate the skip of the matching down level, two residual blocks, then double the length."""

    def __init__(self, cfg: DiffusionConfig, cin: int, cout: int, cond_dim: int):
        super().__init__()
        self.blocks = nn.ModuleList([ResidualBlock(cfg, 2 * cin, cout, cond_dim),
                                     ResidualBlock(cfg, cout, cout, cond_dim)])
        self.upsample = nn.ConvTranspose1d(cout, cout, 4, stride=2, padding=1)

    def forward(self, x: torch.Tensor, skip: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x, skip], dim=1)
        for block in self.blocks:
            x = block(x, cond)
        return self.upsample(x)


class ConditionalUnet1d(nn.Module):
    """Noisy actions [B, T, A], timesteps [B] and global conditioning [B, G] -> the prediction [B, T, A]."""

    def __init__(self, cfg: DiffusionConfig, global_cond_dim: int):
        super().__init__()
        dims = cfg.down_dims
        self.step_embed = nn.Sequential(SinusoidalEmbedding(cfg.step_embed_dim),
                                        nn.Linear(cfg.step_embed_dim, 4 * cfg.step_embed_dim), nn.Mish(),
                                        nn.Linear(4 * cfg.step_embed_dim, cfg.step_embed_dim))
        cond_dim = cfg.step_embed_dim + global_cond_dim
        ins = [cfg.action_dim] + dims[:-1]
        self.down = nn.ModuleList(DownLevel(cfg, cin, cout, cond_dim, last=i == len(dims) - 1)
                                  for i, (cin, cout) in enumerate(zip(ins, dims)))
        self.mid = nn.ModuleList([ResidualBlock(cfg, dims[-1], dims[-1], cond_dim) for _ in range(2)])
        # One up level per downsampling, each taking the skip of a deeper level (from the deepest up); the
        # shallowest level's skip goes unused, as in the paper's network.
        self.up = nn.ModuleList(UpLevel(cfg, cin, cout, cond_dim) for cin, cout in zip(dims[:0:-1], dims[-2::-1]))
        self.final = nn.Sequential(ConvBlock(dims[0], dims[0], cfg.kernel_size, cfg.final_n_groups or cfg.n_groups),
                                   nn.Conv1d(dims[0], cfg.action_dim, 1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, global_cond: torch.Tensor) -> torch.Tensor:
        cond = torch.cat([self.step_embed(t), global_cond], dim=-1)
        x = x.transpose(1, 2)  # [B, A, T]: convolve over time
        skips = []
        for level in self.down:
            x, skip = level(x, cond)
            skips.append(skip)
        for block in self.mid:
            x = block(x, cond)
        for level in self.up:
            x = level(x, skips.pop(), cond)
        return self.final(x).transpose(1, 2)
