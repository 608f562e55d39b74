"""Decoder-only LLM config: the hyperparameters of a Llama / Qwen2 / Qwen3 style transformer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from longboat.config.base import StrictModel


class RopeScaling(StrictModel):
    """Llama-3.1 RoPE frequency scaling: long wavelengths are stretched by ``factor``, short ones kept."""

    type: Literal["llama3"] = "llama3"
    factor: float = Field(gt=0)
    low_freq_factor: float = Field(gt=0)
    high_freq_factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(gt=0)

    @model_validator(mode="after")
    def _check(self) -> RopeScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"rope_scaling.high_freq_factor ({self.high_freq_factor}) must be greater than "
                f"low_freq_factor ({self.low_freq_factor})"
            )
        return self


class DecoderConfig(StrictModel):
    """Pre-norm decoder with RoPE, grouped-query attention and a SwiGLU MLP."""

    vocab_size: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_layers: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int | None = Field(default=None, gt=0)  # None: one kv head per query head
    head_dim: int | None = Field(default=None, gt=0)  # None: d_model // n_heads
    ffn_dim: int = Field(gt=0)
    max_seq_len: int = Field(default=4096, gt=0)
    rope_theta: float = Field(default=10000.0, gt=0)
    rope_scaling: RopeScaling | None = None
    norm_eps: float = Field(default=1e-5, gt=0)
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    init_std: float = Field(default=0.02, gt=0)

    @model_validator(mode="after")
    def _check(self) -> DecoderConfig:
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads}): "
                "each key/value head serves a whole group of query heads"
            )
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) is not divisible by n_heads ({self.n_heads}); "
                "set head_dim explicitly"
            )
        if self.head_size % 2:
            raise ValueError(f"head_dim ({self.head_size}) must be even for rotary embeddings")
        return self

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads with the default resolved."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def head_size(self) -> int:
        """Per-head dimension with the default resolved."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    def num_params(self, include_embeddings: bool = True) -> int:
        """Parameter count computed from the config alone; without embeddings excludes the token
        table and the output head (counted once when tied)."""
        d, hd, h, kv = self.d_model, self.head_size, self.n_heads, self.kv_heads
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.qkv_bias:
            attn += h * hd + 2 * kv * hd
        if self.qk_norm:
            attn += 2 * hd
        block = attn + 3 * d * self.ffn_dim + 2 * d
        body = self.n_layers * block + d
        if not include_embeddings:
            return body
        tables = 1 if self.tie_embeddings else 2
        return body + tables * self.vocab_size * d

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token: 6·(non-embedding params + output head) + 12·L·H·d_head·S."""
        n = self.num_params(include_embeddings=False) + self.vocab_size * self.d_model
        return 6 * n + 12 * self.n_layers * self.n_heads * self.head_size * seq_len
