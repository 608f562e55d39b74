"""DETR's transformer as ACT uses it (post-norm, or pre-norm as an option): positions are added to queries and
keys, never to values.

Tokens are batch-first [B, L, d_model]. ``key_padding`` masks are boolean [B, L], True where a key is padding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from longboat.models.policy.act.config import ACTConfig


def sinusoid_1d(length: int, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """[length, dim] sine/cosine positions (Vaswani et al.), the CVAE encoder's fixed positions."""
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    freq = 10000.0 ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    table = torch.zeros(length, dim, device=device)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


def sinusoid_2d(height: int, width: int, dim: int, device: torch.device | None = None,
                interleaved: bool = False) -> torch.Tensor:
    """[height * width, dim] positions of a feature map, row-major: half the channels encode the row, half the
    column, each normalised to (0, 2π] as DETR's ``PositionEmbeddingSine(normalize=True)``.

    ``interleaved``: DETR's own layout, sine and cosine of each frequency side by side, positions divided by
    ``n + 1e-6`` and by the frequency (not multiplied by its inverse), rounding as DETR and LeRobot's ACT do."""
    quarter = dim // 4
    if interleaved:
        half = dim // 2
        inv = 10000 ** (2 * (torch.arange(half, device=device, dtype=torch.float32) // 2) / half)

        def axis(n: int) -> torch.Tensor:
            pos = torch.arange(1, n + 1, device=device, dtype=torch.float32)
            angle = (pos / (pos[-1:] + 1e-6) * (2 * math.pi))[:, None] / inv  # [n, dim / 2]
            return torch.stack([angle[:, 0::2].sin(), angle[:, 1::2].cos()], dim=-1).flatten(1)
    else:
        freq = 10000.0 ** (-torch.arange(quarter, device=device, dtype=torch.float32) / quarter)

        def axis(n: int) -> torch.Tensor:
            angle = (torch.arange(1, n + 1, device=device, dtype=torch.float32) / n * 2 * math.pi)[:, None] * freq
            return torch.cat([angle.sin(), angle.cos()], dim=1)  # [n, dim / 2]

    rows, cols = axis(height), axis(width)
    return torch.cat([rows[:, None].expand(height, width, -1), cols[None].expand(height, width, -1)], dim=-1
                     ).reshape(height * width, dim)


class Attention(nn.Module):
    def __init__(self, cfg: ACTConfig):
        super().__init__()
        self.n_heads, self.dropout = cfg.n_heads, cfg.dropout
        self.wq = nn.Linear(cfg.d_model, cfg.d_model)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                key_padding: torch.Tensor | None = None) -> torch.Tensor:
        B, Lq, d = q.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(B, x.shape[1], self.n_heads, d // self.n_heads).transpose(1, 2)

        mask = None if key_padding is None else ~key_padding[:, None, None, :]
        out = F.scaled_dot_product_attention(heads(self.wq(q)), heads(self.wk(k)), heads(self.wv(v)), attn_mask=mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.wo(out.transpose(1, 2).reshape(B, Lq, d))


class FeedForward(nn.Module):
    def __init__(self, cfg: ACTConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.act = F.gelu if cfg.activation == "gelu" else F.relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.drop(self.act(self.w1(x))))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ACTConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.ffn = FeedForward(cfg)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.pre_norm = cfg.pre_norm

    def forward(self, x: torch.Tensor, pos: torch.Tensor, key_padding: torch.Tensor | None = None) -> torch.Tensor:
        if self.pre_norm:
            h = self.norm1(x)
            x = x + self.drop(self.self_attn(h + pos, h + pos, h, key_padding))
            return x + self.drop(self.ffn(self.norm2(x)))
        qk = x + pos
        x = self.norm1(x + self.drop(self.self_attn(qk, qk, x, key_padding)))
        return self.norm2(x + self.drop(self.ffn(x)))


class Encoder(nn.Module):
    def __init__(self, cfg: ACTConfig, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(n_layers))
        # Pre-norm stacks end in a norm (their residual stream is otherwise never normalised).
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.pre_norm else None

    def forward(self, x: torch.Tensor, pos: torch.Tensor, key_padding: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, pos, key_padding)
        return x if self.norm is None else self.norm(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ACTConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.cross_attn = Attention(cfg)
        self.ffn = FeedForward(cfg)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.pre_norm = cfg.pre_norm

    def forward(self, x: torch.Tensor, query_pos: torch.Tensor, memory: torch.Tensor,
                memory_pos: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            h = self.norm1(x)
            x = x + self.drop(self.self_attn(h + query_pos, h + query_pos, h))
            x = x + self.drop(self.cross_attn(self.norm2(x) + query_pos, memory + memory_pos, memory))
            return x + self.drop(self.ffn(self.norm3(x)))
        qk = x + query_pos
        x = self.norm1(x + self.drop(self.self_attn(qk, qk, x)))
        x = self.norm2(x + self.drop(self.cross_attn(x + query_pos, memory + memory_pos, memory)))
        return self.norm3(x + self.drop(self.ffn(x)))


class Decoder(nn.Module):
    def __init__(self, cfg: ACTConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)

    def forward(self, x: torch.Tensor, query_pos: torch.Tensor, memory: torch.Tensor,
                memory_pos: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, query_pos, memory, memory_pos)
        return self.norm(x)
