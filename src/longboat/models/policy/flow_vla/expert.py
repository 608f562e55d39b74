"""The action expert: a narrower transformer over [state token, noisy action tokens] whose layer i attends to the
backbone's layer-i keys and values of the prefix as well as to its own (pi0's attention shared per layer).

Its query/key/value heads are the backbone's (count and size), so each layer's attention is one softmax over the
prefix keys followed by the suffix keys; only the widths of the residual stream and the MLP differ.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from longboat.models.llm.model import FeedForward
from longboat.models.llm.rope import apply_rope
from longboat.models.policy.flow_vla.config import FlowVLAConfig


def time_embedding(t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0) -> torch.Tensor:
    """Sine-cosine embedding [B, dim] of flow times t [B] in [0, 1] (pi0's periods: sensitive to small changes)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angles = t.to(torch.float64)[:, None] * (2 * math.pi / period)[None]
    return torch.cat((angles.sin(), angles.cos()), dim=-1).to(t.dtype)


class ExpertAttention(nn.Module):
    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        b, width = cfg.backbone, cfg.expert.d_model
        self.head_dim = hd = b.head_size
        self.wq = nn.Linear(width, b.n_heads * hd, bias=b.qkv_bias)
        self.wk = nn.Linear(width, b.kv_heads * hd, bias=b.qkv_bias)
        self.wv = nn.Linear(width, b.kv_heads * hd, bias=b.qkv_bias)
        self.wo = nn.Linear(b.n_heads * hd, width, bias=False)
        # With a Qwen3-style backbone, the expert's keys are normed like the prefix keys they sit beside.
        self.q_norm = nn.RMSNorm(hd, eps=b.norm_eps) if b.qk_norm else None
        self.k_norm = nn.RMSNorm(hd, eps=b.norm_eps) if b.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                prefix_kv: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """x [B, S, width]; prefix_kv: keys and values [B, kv_heads, P, head_dim]; mask [B, 1, S, P + S]."""
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, -1, self.head_dim)
        k = self.wk(x).view(B, S, -1, self.head_dim)
        v = self.wv(x).view(B, S, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        k = torch.cat((prefix_kv[0], k), dim=2)
        v = torch.cat((prefix_kv[1], v), dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
        return self.wo(out.transpose(1, 2).reshape(B, S, -1))


class ExpertBlock(nn.Module):
    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        width, eps = cfg.expert.d_model, cfg.expert.norm_eps
        self.attention_norm = nn.RMSNorm(width, eps=eps)
        self.attention = ExpertAttention(cfg)
        self.ffn_norm = nn.RMSNorm(width, eps=eps)
        self.feed_forward = FeedForward(width, cfg.expert.ffn_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                prefix_kv: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, prefix_kv, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class ActionExpert(nn.Module):
    """(state, noisy actions x_t, flow time t, prefix keys/values per layer) -> velocity [B, horizon, A]."""

    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        width = cfg.expert.d_model
        self.uses_state = cfg.state_feature is not None and cfg.state_dim > 0
        self.state_proj = nn.Linear(cfg.state_dim, width) if self.uses_state else None
        self.action_in = nn.Linear(cfg.action_dim, width)
        # pi0: the action token and the time embedding, concatenated, through a two-layer swish MLP.
        self.time_mlp_in = nn.Linear(2 * width, width)
        self.time_mlp_out = nn.Linear(width, width)
        self.layers = nn.ModuleList(ExpertBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(width, eps=cfg.expert.norm_eps)
        self.action_out = nn.Linear(width, cfg.action_dim)

    @torch.no_grad()
    def init_weights(self, std: float) -> None:
        out_std = std / math.sqrt(2 * len(self.layers))  # residual projections, as the backbone's
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                residual = name.endswith(("attention.wo", "feed_forward.w2"))
                nn.init.normal_(module.weight, std=out_std if residual else std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.RMSNorm):
                module.reset_parameters()

    def suffix_mask(self, prefix_valid: torch.Tensor, horizon: int) -> torch.Tensor:
        """[B, 1, S, P + S]: every suffix token sees the valid prefix; the state token sees itself, each action
        token the state and every action token (pi0's blocks: prefix, state, actions)."""
        blocks = torch.tensor([0] * self.uses_state + [1] * horizon, device=prefix_valid.device)
        own = blocks[None, :] <= blocks[:, None]
        B, S = prefix_valid.shape[0], blocks.shape[0]
        return torch.cat((prefix_valid[:, None, :].expand(B, S, -1), own.expand(B, S, S)), dim=-1)[:, None]

    def forward(self, state: torch.Tensor | None, x_t: torch.Tensor, t: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, prefix_kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor
                ) -> torch.Tensor:
        """``cos``/``sin`` [B, S, head_dim] at the suffix positions; ``prefix_kv[i]`` is backbone layer i's."""
        actions = self.action_in(x_t)
        times = time_embedding(t, actions.shape[-1])[:, None].expand_as(actions)
        h = self.time_mlp_out(F.silu(self.time_mlp_in(torch.cat((actions, times), dim=-1))))
        if self.uses_state:
            h = torch.cat((self.state_proj(state)[:, None], h), dim=1)
        for layer, kv in zip(self.layers, prefix_kv):
            h = layer(h, cos, sin, kv, mask)
        return self.action_out(self.norm(h[:, -x_t.shape[1]:]))
