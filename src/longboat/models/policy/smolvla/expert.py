"""SmolVLA's action expert: Llama-like layers beside the backbone's, reading its prefix keys and values.

A cross-attention layer's queries are its own (rotated from position 0), its keys and values projections of the
backbone layer's rotated prefix keys and values (not rotated again); a self-attention layer's queries, keys and
values are its own at the positions after the valid prefix, attending to the prefix's keys and values followed by
its own, causally. Heads (count and size) are the backbone's; only the residual and MLP widths differ.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from longboat.models.llm.model import FeedForward
from longboat.models.llm.rope import apply_rope
from longboat.models.policy.smolvla.config import SmolVLAConfig


class ExpertAttention(nn.Module):
    def __init__(self, cfg: SmolVLAConfig, cross: bool):
        super().__init__()
        b, width = cfg.vlm.language, cfg.expert.d_model
        self.cross, self.head_dim = cross, b.head_size
        kv_in = b.kv_heads * b.head_size if cross else width
        self.wq = nn.Linear(width, b.n_heads * b.head_size, bias=b.qkv_bias)
        self.wk = nn.Linear(kv_in, b.kv_heads * b.head_size, bias=b.qkv_bias)
        self.wv = nn.Linear(kv_in, b.kv_heads * b.head_size, bias=b.qkv_bias)
        self.wo = nn.Linear(b.n_heads * b.head_size, width, bias=False)

    def forward(self, x: torch.Tensor, rope: dict, prefix_kv: tuple[torch.Tensor, torch.Tensor],
                masks: dict) -> torch.Tensor:
        """x [B, S, width]; prefix_kv: the backbone layer's rotated keys and values [B, kv_heads, P, head_dim];
        ``rope``/``masks``: "cross" and "self" tables [B, S, head_dim] and masks [B, 1, S, keys]."""
        B, S, _ = x.shape
        kind = "cross" if self.cross else "self"
        q = apply_rope(self.wq(x).view(B, S, -1, self.head_dim), *rope[kind]).transpose(1, 2)
        if self.cross:
            P = prefix_kv[0].shape[2]
            k = self.wk(prefix_kv[0].transpose(1, 2).reshape(B, P, -1)).view(B, P, -1, self.head_dim)
            v = self.wv(prefix_kv[1].transpose(1, 2).reshape(B, P, -1)).view(B, P, -1, self.head_dim)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        else:
            k = apply_rope(self.wk(x).view(B, S, -1, self.head_dim), *rope[kind]).transpose(1, 2)
            v = self.wv(x).view(B, S, -1, self.head_dim).transpose(1, 2)
            k, v = torch.cat((prefix_kv[0], k), dim=2), torch.cat((prefix_kv[1], v), dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[kind], enable_gqa=q.shape[1] != k.shape[1])
        return self.wo(out.transpose(1, 2).reshape(B, S, -1))


class ExpertLayer(nn.Module):
    def __init__(self, cfg: SmolVLAConfig, cross: bool):
        super().__init__()
        width, eps = cfg.expert.d_model, cfg.expert.norm_eps
        self.attention_norm = nn.RMSNorm(width, eps=eps)
        self.attention = ExpertAttention(cfg, cross)
        self.ffn_norm = nn.RMSNorm(width, eps=eps)
        self.feed_forward = FeedForward(width, cfg.expert.ffn_dim)

    def forward(self, x: torch.Tensor, rope: dict, prefix_kv: tuple[torch.Tensor, torch.Tensor],
                masks: dict) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope, prefix_kv, masks)
        return x + self.feed_forward(self.ffn_norm(x))


class SmolVLAExpert(nn.Module):
    """Expert layers [n_layers] and the final norm; ``backbone_layer[i]`` is the backbone layer layer i sits beside."""

    def __init__(self, cfg: SmolVLAConfig):
        super().__init__()
        every = cfg.vlm.language.n_layers // cfg.expert.n_layers
        self.backbone_layer = [i * every for i in range(cfg.expert.n_layers)]
        self_layers = set(cfg.self_attention_layers())
        self.layers = nn.ModuleList(ExpertLayer(cfg, cross=layer not in self_layers) for layer in self.backbone_layer)
        self.norm = nn.RMSNorm(cfg.expert.d_model, eps=cfg.expert.norm_eps)

    def forward(self, h: torch.Tensor, rope: dict, prefix_kv: list[tuple[torch.Tensor, torch.Tensor]],
                masks: dict) -> torch.Tensor:
        for layer, index in zip(self.layers, self.backbone_layer):
            h = layer(h, rope, prefix_kv[index], masks)
        return self.norm(h)
