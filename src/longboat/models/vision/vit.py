"""A small Vision Transformer (Dosovitskiy et al., 2021) returning one token per patch, for policies' cameras.

Patches are embedded by a strided convolution, a learned position embedding is added, then pre-norm blocks
(x = x + MHSA(LN(x)); x = x + MLP(LN(x))) and a final LayerNorm (optional). There is no class token: a VLA reads every patch
token. LayerNorm keeps a sample's features independent of its batch mates.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from longboat.config.base import StrictModel


class ViTConfig(StrictModel):
    patch_size: int = Field(default=8, gt=0, description="pixels per patch side; the image sides must divide by it")
    d_model: int = Field(default=192, gt=0)
    n_layers: int = Field(default=6, gt=0)
    n_heads: int = Field(default=3, gt=0)
    mlp_ratio: float = Field(default=4.0, gt=0)
    norm_eps: float = Field(default=1e-6, gt=0)
    final_norm: bool = Field(default=True, description="a LayerNorm after the last block (LLaVA's towers read the "
                                                        "last block's output without one)")

    @model_validator(mode="after")
    def _check(self) -> ViTConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"vision.d_model ({self.d_model}) must be divisible by vision.n_heads ({self.n_heads})")
        return self

    def num_patches(self, height: int, width: int) -> int:
        return (height // self.patch_size) * (width // self.patch_size)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask`` [B, 1, 1, N] (bool): the keys each image's patches may attend to (None: all)."""
        B, N, D = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(B, N, D))


class Block(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        hidden = int(cfg.d_model * cfg.mlp_ratio)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = SelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(hidden, cfg.d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask)
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """[B, C, H, W] images -> [B, (H / patch) * (W / patch), d_model] patch tokens."""

    def __init__(self, cfg: ViTConfig, image_shape: tuple[int, int, int]):
        super().__init__()
        channels, height, width = image_shape
        if height % cfg.patch_size or width % cfg.patch_size:
            raise ValueError(f"image {height}x{width} does not divide into {cfg.patch_size}-pixel patches")
        self.cfg = cfg
        self.patch_embed = nn.Conv2d(channels, cfg.d_model, cfg.patch_size, cfg.patch_size)
        self.pos_embed = nn.Parameter(torch.empty(1, cfg.num_patches(height, width), cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.final_norm else None
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Truncated-normal weights (std 0.02), zero biases, unit norms, as ViT; valid after ``to_empty``."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.norm(x) if self.norm is not None else x
