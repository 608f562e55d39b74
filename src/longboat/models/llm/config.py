"""Decoder-only LLM config: Llama / Qwen2 / Qwen3 dense transformers, plus mixture-of-experts feed-forwards
(Mixtral, Qwen3-MoE, DeepSeek-V3) and DeepSeek multi-head latent attention."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from longboat.config.base import StrictModel
from longboat.models.moe.config import MoEConfig


_LLAMA3_FIELDS = ("low_freq_factor", "high_freq_factor")
_YARN_FIELDS = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")


class RopeScaling(StrictModel):
    """RoPE frequency scaling for contexts beyond the pretraining length ``original_max_position_embeddings``.

    ``llama3`` (Llama 3.1): long wavelengths are stretched by ``factor``, short ones kept, the band between
    blended. ``yarn`` (YaRN; Qwen, DeepSeek-V3): dimensions that turn fewer than ``beta_slow`` times over the
    original context are interpolated by ``factor``, those turning more than ``beta_fast`` times are kept, with
    a linear ramp between; cos/sin are multiplied by ``attention_factor`` (by default derived from ``factor``,
    ``mscale`` and ``mscale_all_dim``), and multi-head latent attention also multiplies its softmax scale by
    mscale(factor, mscale_all_dim)^2. Unset yarn fields take transformers' defaults.
    """

    type: Literal["llama3", "yarn"] = "llama3"
    factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(gt=0)
    low_freq_factor: float | None = Field(default=None, gt=0)
    high_freq_factor: float | None = Field(default=None, gt=0)
    beta_fast: float | None = Field(default=None, gt=0)  # None: 32
    beta_slow: float | None = Field(default=None, gt=0)  # None: 1
    mscale: float | None = Field(default=None, ge=0)
    mscale_all_dim: float | None = Field(default=None, ge=0)
    attention_factor: float | None = Field(default=None, gt=0)
    truncate: bool | None = None  # None: True (correction range rounded outwards to whole dimensions)

    @model_validator(mode="after")
    def _check(self) -> RopeScaling:
        own, other = (_LLAMA3_FIELDS, _YARN_FIELDS) if self.type == "llama3" else (_YARN_FIELDS, _LLAMA3_FIELDS)
        stray = [k for k in other if getattr(self, k) is not None]
        if stray:
            raise ValueError(f"rope_scaling.{stray[0]} does not apply to type {self.type!r} "
                             f"(its fields: factor, original_max_position_embeddings, {', '.join(own)})")
        if self.type == "llama3":
            missing = [k for k in _LLAMA3_FIELDS if getattr(self, k) is None]
            if missing:
                raise ValueError(f"rope_scaling.{missing[0]} is required with type 'llama3'")
            if self.high_freq_factor <= self.low_freq_factor:
                raise ValueError(
                    f"rope_scaling.high_freq_factor ({self.high_freq_factor}) must be greater than "
                    f"low_freq_factor ({self.low_freq_factor})"
                )
        elif (self.beta_fast or 32) <= (self.beta_slow or 1):
            raise ValueError(f"rope_scaling.beta_fast ({self.beta_fast or 32}) must be greater than "
                             f"beta_slow ({self.beta_slow or 1})")
        return self


class DecoderConfig(StrictModel):
    """Pre-norm decoder with RoPE, grouped-query (or latent) attention and a SwiGLU (or MoE) feed-forward."""

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
    # Multimodal RoPE (Qwen2-VL and later): positions [3, B, T] (time, height, width); each rotary frequency reads
    # one of the three rows. ``mrope_section``: how many of the head_dim/2 frequencies each row drives, in
    # consecutive sections (Qwen2.5-VL) or, with ``mrope_interleaved``, frequency i from row i mod 3 while that
    # row's section lasts (Qwen3-VL), or, with ``mrope_alternating``, the first 2·section[1] frequencies alternate
    # height (even) and width (odd) and the last section[0] read time (ERNIE-4.5-VL; section[1] == section[2]).
    # Positions [B, T] (text) rotate as plain RoPE.
    mrope_section: tuple[int, int, int] | None = None
    mrope_interleaved: bool = False
    mrope_alternating: bool = False
    norm_eps: float = Field(default=1e-5, gt=0)
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    init_std: float = Field(default=0.02, gt=0)

    # Mixture of experts: every layer not listed in dense_layers uses ``moe`` instead of a dense SwiGLU of
    # width ffn_dim (DeepSeek's first_k_dense_replace = [0..k-1]; Qwen3-MoE's mlp_only_layers).
    moe: MoEConfig | None = None
    dense_layers: list[int] = Field(default_factory=list)
    # Experts for image tokens (ERNIE-4.5-VL): each MoE layer routes text tokens through ``moe`` and the tokens the
    # composed model marks as vision through these (own router, bias and width; ``moe``'s shared experts see all).
    vision_moe: MoEConfig | None = None

    # Multi-head latent attention (DeepSeek-V2/V3): "mla" replaces wq/wk/wv with low-rank projections and
    # ignores n_kv_heads, head_dim, qkv_bias and qk_norm.
    attention: Literal["gqa", "mla"] = "gqa"
    q_lora_rank: int | None = Field(default=None, gt=0)  # None: a plain full-rank query projection
    kv_lora_rank: int | None = Field(default=None, gt=0)
    qk_nope_head_dim: int | None = Field(default=None, gt=0)
    qk_rope_head_dim: int | None = Field(default=None, gt=0)
    v_head_dim: int | None = Field(default=None, gt=0)
    rope_interleave: bool = True  # DeepSeek checkpoints rotate adjacent pairs (2i, 2i+1) of the rope part

    @model_validator(mode="after")
    def _check(self) -> DecoderConfig:
        if self.moe is not None and self.moe.d_model != self.d_model:
            raise ValueError(f"moe.d_model ({self.moe.d_model}) must equal d_model ({self.d_model})")
        bad = [i for i in self.dense_layers if not 0 <= i < self.n_layers]
        if bad:
            raise ValueError(f"dense_layers {bad} are outside the {self.n_layers} layers (0..{self.n_layers - 1})")
        if self.dense_layers and self.moe is None:
            raise ValueError("dense_layers is set but moe is not: every layer is already dense")
        if self.vision_moe is not None and (self.moe is None or self.vision_moe.d_model != self.d_model
                                            or self.vision_moe.n_shared_experts):
            raise ValueError("vision_moe needs moe, the decoder's d_model and no shared experts of its own")
        if self.mrope_interleaved and self.mrope_section is None:
            raise ValueError("mrope_interleaved needs mrope_section")
        if self.mrope_alternating:
            if self.mrope_section is None or self.mrope_interleaved:
                raise ValueError("mrope_alternating needs mrope_section and excludes mrope_interleaved")
            if self.mrope_section[1] != self.mrope_section[2]:
                raise ValueError(f"mrope_alternating needs equal height and width sections, got mrope_section "
                                 f"{list(self.mrope_section)}")
        if self.mrope_section is not None and self.attention == "gqa" \
                and sum(self.mrope_section) != self.head_size // 2:
            raise ValueError(f"mrope_section {list(self.mrope_section)} must sum to head_dim / 2 "
                             f"({self.head_size // 2})")
        if self.attention == "mla":
            if self.mrope_section is not None:
                raise ValueError("mrope_section is a grouped-query attention option; MLA has none")
            missing = [k for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
                       if getattr(self, k) is None]
            if missing:
                raise ValueError(f"attention='mla' needs {', '.join(missing)}")
            if self.qk_rope_head_dim % 2:
                raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be even for rotary embeddings")
            if self.qkv_bias or self.qk_norm:
                raise ValueError("qkv_bias and qk_norm are grouped-query attention options; MLA has neither")
            return self
        mla_only = [k for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
                    if getattr(self, k) is not None]
        if mla_only:
            raise ValueError(f"{', '.join(mla_only)} only apply with attention='mla'")
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

    @property
    def rope_dim(self) -> int:
        """Width of the rotated part of each query/key head."""
        return self.qk_rope_head_dim if self.attention == "mla" else self.head_size

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self.dense_layers

    def _attention_params(self) -> int:
        d, h = self.d_model, self.n_heads
        if self.attention == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            r = self.q_lora_rank
            q = d * h * qk if r is None else d * r + r + r * h * qk  # q_a_proj, q_a_layernorm, q_b_proj
            kv = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv += self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + h * self.v_head_dim * d
        hd, kv = self.head_size, self.kv_heads
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.qkv_bias:
            attn += h * hd + 2 * kv * hd
        if self.qk_norm:
            attn += 2 * hd
        return attn

    def _moe_params(self, active: bool) -> int:
        m, d = self.moe, self.d_model
        routed = (m.top_k if active else m.n_experts) * 3 * d * m.expert_ffn_dim
        out = d * m.n_experts + routed + 3 * d * m.shared_dim + (d if m.shared_expert_gate else 0)
        if (v := self.vision_moe) is not None:  # a token uses one group: count the text group's as active
            out += 0 if active else d * v.n_experts + v.n_experts * 3 * d * v.expert_ffn_dim
        return out

    def num_params(self, include_embeddings: bool = True, active: bool = False) -> int:
        """Parameter count computed from the config alone; without embeddings excludes the token
        table and the output head (counted once when tied). ``active``: only the experts one token uses."""
        d = self.d_model
        body = d
        for i in range(self.n_layers):
            ffn = self._moe_params(active) if self.is_moe_layer(i) else 3 * d * self.ffn_dim
            body += self._attention_params() + ffn + 2 * d
        if not include_embeddings:
            return body
        tables = 1 if self.tie_embeddings else 2
        return body + tables * self.vocab_size * d

    def describe(self) -> str:
        """One line for ``longboat models``."""
        return (f"{self.num_params() / 1e6:9.1f}M  layers {self.n_layers:3d}  d_model {self.d_model:5d}  "
                f"heads {self.n_heads}/{self.kv_heads}  vocab {self.vocab_size}")

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token: 6·(active non-embedding params + output head) + 12·L·H·d_head·S.

        With MLA the score and value products have different widths: 6·L·H·(d_qk + d_v)·S.
        """
        n = self.num_params(include_embeddings=False, active=True) + self.vocab_size * self.d_model
        if self.attention == "mla":
            width = self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim
            return 6 * n + 6 * self.n_layers * self.n_heads * width * seq_len
        return 6 * n + 12 * self.n_layers * self.n_heads * self.head_size * seq_len
