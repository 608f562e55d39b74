"""Multi-head latent attention (DeepSeek-V2 / V3) and its cache of compressed keys and values.

Keys and values come from one low-rank latent c_kv = RMSNorm(W_kv_a x) shared by all heads; each head expands
it with kv_b_proj into a "nope" key part and a value. Positions enter only through a small extra key part k_pe
(one per token, shared by all heads) and the matching query part, both rotated with RoPE. The cache holds
c_kv and the rotated k_pe, kv_lora_rank + qk_rope_head_dim numbers per token and layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from longboat.models.llm.cache import StaticCache, chunk_attention_mask
from longboat.models.llm.config import DecoderConfig
from longboat.models.llm.rope import apply_rope

# DeepSeek's reference code builds the latent norms with a fixed eps, independent of rms_norm_eps.
LATENT_NORM_EPS = 1e-6


class LatentCache(StaticCache):
    """Per-layer latents c_kv [B, max_len, kv_lora_rank] and rotated k_pe [B, max_len, rope_dim]."""

    def __init__(
        self, n_layers: int, batch: int, max_len: int, kv_rank: int, rope_dim: int,
        dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
    ):
        super().__init__((n_layers, batch, max_len, kv_rank), (n_layers, batch, max_len, rope_dim), time_dim=2,
                         dtype=dtype, device=device)


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...): pairs (2i, 2i+1) become (i, i + d/2).

    Applied to the rope parts of both q and k it turns DeepSeek's pairwise rotation into the rotate-half form
    of ``apply_rope``; q·k is unchanged by the common permutation.
    """
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


class MultiHeadLatentAttention(nn.Module):
    """MLA: low-rank queries (optional), a shared compressed key/value latent and a decoupled RoPE key."""

    def __init__(self, cfg: DecoderConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        h = cfg.n_heads
        self.nope_dim, self.rope_dim, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.kv_rank = cfg.kv_lora_rank
        self.interleaved = cfg.rope_interleave
        qk_dim = self.nope_dim + self.rope_dim
        self.scale = qk_dim**-0.5
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(cfg.d_model, h * qk_dim, bias=False)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(cfg.d_model, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = nn.RMSNorm(cfg.q_lora_rank, eps=LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.d_model, self.kv_rank + self.rope_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(self.kv_rank, eps=LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.kv_rank, h * (self.nope_dim + self.v_dim), bias=False)
        self.wo = nn.Linear(h * self.v_dim, cfg.d_model, bias=False)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(deinterleave(x) if self.interleaved else x, cos, sin)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LatentCache | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``mask``: a [B, 1, T, T] boolean mask that replaces the causal one (packed documents)."""
        B, T, _ = x.shape
        q = self.q_proj(x) if self.q_proj is not None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        # Head counts come from the projections (-1), so a tensor-parallel shard of heads works unchanged.
        q_nope, q_pe = q.view(B, T, -1, self.nope_dim + self.rope_dim).split([self.nope_dim, self.rope_dim], dim=-1)
        q_pe = self._rope(q_pe, cos, sin)

        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_rank, self.rope_dim], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv)
        k_pe = self._rope(k_pe.unsqueeze(2), cos, sin).squeeze(2)  # one rotated key part per token

        causal = mask is None and T > 1
        if cache is not None:
            mask, causal = chunk_attention_mask(cache.length, T, x.device)
            c_kv, k_pe = cache.update(self.layer_id, c_kv, k_pe)
        S = c_kv.shape[1]
        # Expand the latent of every visible position into per-head keys and values.
        kv = self.kv_b_proj(c_kv).view(B, S, -1, self.nope_dim + self.v_dim)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat((k_nope, k_pe.unsqueeze(2).expand(B, S, kv.shape[2], self.rope_dim)), dim=-1)
        q = torch.cat((q_nope, q_pe), dim=-1)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, len, dim]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))

    def init_weights(self, std: float, out_std: float) -> None:
        for lin in (self.q_proj, self.q_a_proj, self.q_b_proj, self.kv_a_proj_with_mqa, self.kv_b_proj):
            if lin is not None:
                nn.init.normal_(lin.weight, std=std)
        for norm in (self.q_a_layernorm, self.kv_a_layernorm):
            if norm is not None:
                norm.reset_parameters()
        nn.init.normal_(self.wo.weight, std=out_std)
