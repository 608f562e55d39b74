"""DETR's post-norm transformer as ACT uses it: positions are added to queries and keys, never to values.

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


def sinusoid_2d(height: int, width: int, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """[height * width, dim] positions of a feature map, row-major: half the channels encode the row, half the
    column, each normalised to (0, 2π] as DETR's ``PositionEmbeddingSine(normalize=True)``."""
    quarter = dim // 4
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.drop(F.relu(self.w1(x))))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ACTConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.ffn = FeedForward(cfg)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, key_padding: torch.Tensor | None = None) -> torch.Tensor:
        qk = x + pos
        x = self.norm1(x + self.drop(self.self_attn(qk, qk, x, key_padding)))
        return self.norm2(x + self.drop(self.ffn(x)))


class Encoder(nn.Module):
    def __init__(self, cfg: ACTConfig, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, key_padding: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, pos, key_padding)
        return x


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

    def forward(self, x: torch.Tensor, query_pos: torch.Tensor, memory: torch.Tensor,
                memory_pos: torch.Tensor) -> torch.Tensor:
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
