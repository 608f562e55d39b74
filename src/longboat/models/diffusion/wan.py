"""A Wan-style video diffusion transformer (Wan 2.1 text-to-video): 3-D patches, 3-D rotary positions, text by
cross-attention, the timestep by adaLN modulation.

Video latents [B, C, F, H, W] are cut into (p_t, p_h, p_w) patches by a strided 3-D convolution. Each block runs
self-attention with RMS-normalised queries and keys and rotary positions whose head dimensions are split between
frame, row and column; cross-attention to the projected text embeddings; and a GELU MLP. The timestep embedding
regresses one shift/scale/gate set for all blocks, and each block adds a learned table of its own to it (Wan's
``scale_shift_table``). No position embedding is fixed to a size: any frame count and image side the patches divide
(up to ``rope_max_seq_len`` patches per axis) is valid.

Time convention, as ``dit.py``: a float ``t`` is flow time in [0, 1] (1: noise), embedded as ``t · time_scale``;
an integer ``t`` is a timestep on that scale (Wan's flow-matching sampler hands its network sigma · 1000).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from longboat.config.base import StrictModel
from longboat.models.diffusion.dit import timestep_sinusoid, xavier_as_linear


class WanConfig(StrictModel):
    """The defaults are Wan 2.1 T2V 1.3B's layout (12 heads of 128, 30 blocks, UMT5-XXL's 4096-wide text)."""

    takes_clips: ClassVar[bool] = True  # the generator contract: it takes [B, C, F, H, W] clips as well as images

    image_size: int | None = Field(default=None, gt=0, description="the frame side a task trains it at (the network "
                                   "itself takes any side its patches divide); None: not fixed")
    patch_size: tuple[int, int, int] = Field(default=(1, 2, 2), description="frames, rows, columns per patch")
    in_channels: int = Field(default=16, gt=0)
    out_channels: int | None = Field(default=None, gt=0, description="None: in_channels")
    hidden_size: int = Field(default=1536, gt=0)
    num_heads: int = Field(default=12, gt=0)
    depth: int = Field(default=30, gt=0)
    ffn_dim: int = Field(default=8960, gt=0)
    text_dim: int = Field(default=4096, gt=0, description="width of the text encoder's token embeddings")
    freq_dim: int = Field(default=256, gt=0, description="width of the timestep sinusoid (even)")
    cross_attn_norm: bool = Field(default=True, description="an affine LayerNorm before cross-attention")
    eps: float = Field(default=1e-6, gt=0)
    rope_max_seq_len: int = Field(default=1024, gt=0, description="most patches along any one axis")
    rope_theta: float = Field(default=10000.0, gt=0)
    time_scale: float = Field(default=1000.0, gt=0, description="a float time t in [0, 1] is embedded as t·time_scale")

    @model_validator(mode="after")
    def _check(self) -> WanConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.head_dim % 2 or self.head_dim < 6:
            raise ValueError(f"head_dim (hidden_size / num_heads = {self.head_dim}) must be even and at least 6 "
                             "(rotary pairs split over frames, rows and columns)")
        if self.freq_dim % 2:
            raise ValueError(f"freq_dim ({self.freq_dim}) must be even")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def channels_out(self) -> int:
        return self.out_channels or self.in_channels

    @property
    def rope_dims(self) -> tuple[int, int, int]:
        """Head dimensions rotated by the frame, row and column index (Wan: rows and columns a third each)."""
        spatial = 2 * (self.head_dim // 6)
        return self.head_dim - 2 * spatial, spatial, spatial


def rope_angles(cfg: WanConfig) -> torch.Tensor:
    """Rotary angles per position and rotated pair, float64 [rope_max_seq_len, head_dim / 2] on the CPU: the frame
    pairs first, then the row pairs, then the column pairs, each axis with its own frequencies."""
    pos = torch.arange(cfg.rope_max_seq_len, dtype=torch.float64, device="cpu")
    parts = []
    for dim in cfg.rope_dims:
        freqs = 1.0 / cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim)
        parts.append(torch.outer(pos, freqs))
    return torch.cat(parts, dim=1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (x[2k], x[2k+1]) of ``x`` [B, N, H, D] by the angles of ``cos``/``sin`` [N, D/2]."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[:, None], sin[:, None]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).type_as(x)


class AttentionCore(nn.Module):
    """Scaled dot-product attention over token-major queries, keys and values [B, N, H, D] -> [B, N, H, D]: a
    module of its own so that context parallelism can exchange heads for tokens around it."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask`` [B, 1, 1, L]: True where a key is attended (cross-attention to padded text)."""
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return out.transpose(1, 2)


class Attention(nn.Module):
    """Multi-head attention with RMS-normalised queries and keys (over all heads at once, as Wan normalises them);
    self-attention with rotary positions, or cross-attention to a context."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        h = cfg.hidden_size
        self.num_heads, self.eps = cfg.num_heads, cfg.eps
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
        self.q_norm = nn.RMSNorm(h, eps=cfg.eps)
        self.k_norm = nn.RMSNorm(h, eps=cfg.eps)
        self.core = AttentionCore()

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask`` [B, 1, 1, L] (cross-attention): True where the context token is attended."""
        kv = x if context is None else context
        q = self.q_norm(self.q(x)).unflatten(-1, (self.num_heads, -1))
        k = self.k_norm(self.k(kv)).unflatten(-1, (self.num_heads, -1))
        v = self.v(kv).unflatten(-1, (self.num_heads, -1))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if mask is None:  # context parallelism wraps the self-attention core, which takes no mask
            return self.o(self.core(q, k, v).flatten(2))
        return self.o(self.core(q, k, v, mask).flatten(2))


class WanBlock(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        h = cfg.hidden_size
        self.norm1 = nn.LayerNorm(h, eps=cfg.eps, elementwise_affine=False)
        self.self_attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(h, eps=cfg.eps) if cfg.cross_attn_norm else nn.Identity()
        self.cross_attn = Attention(cfg)
        self.norm3 = nn.LayerNorm(h, eps=cfg.eps, elementwise_affine=False)
        self.fc1 = nn.Linear(h, cfg.ffn_dim)
        self.fc2 = nn.Linear(cfg.ffn_dim, h)
        self.modulation = nn.Parameter(torch.empty(1, 6, h))  # added to the shared timestep modulation

    def forward(self, x: torch.Tensor, context: torch.Tensor, mod: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mod``: the timestep's six modulation vectors [B, 6, hidden]; ``mask``: the context's, as attention's."""
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation + mod).chunk(6, dim=1)
        x = x + gate1 * self.self_attn(self.norm1(x) * (1 + scale1) + shift1, rope=rope)
        x = x + self.cross_attn(self.norm2(x), context, mask=mask)
        mlp = self.fc2(F.gelu(self.fc1(self.norm3(x) * (1 + scale2) + shift2), approximate="tanh"))
        return x + gate2 * mlp


class WanFinal(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        h = cfg.hidden_size
        self.norm = nn.LayerNorm(h, eps=cfg.eps, elementwise_affine=False)
        self.modulation = nn.Parameter(torch.empty(1, 2, h))
        self.linear = nn.Linear(h, cfg.channels_out * math.prod(cfg.patch_size))

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.modulation + temb[:, None]).chunk(2, dim=1)
        return self.linear(self.norm(x) * (1 + scale) + shift)


class Wan(nn.Module):
    """``model(x [B, C, F, H, W], t [B], context [B, L, text_dim], context_mask [B, L]) -> [B, out_channels, F, H,
    W]``; an image [B, C, H, W] is taken as a clip of one frame and comes back as an image. ``context_mask`` (True: a
    real token; None: all are) keeps cross-attention off padding."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.patch_embed = nn.Conv3d(cfg.in_channels, h, cfg.patch_size, cfg.patch_size)
        self.time_mlp = nn.Sequential(nn.Linear(cfg.freq_dim, h), nn.SiLU(), nn.Linear(h, h))
        self.time_proj = nn.Linear(h, 6 * h)
        self.text_mlp = nn.Sequential(nn.Linear(cfg.text_dim, h), nn.GELU(approximate="tanh"), nn.Linear(h, h))
        self.blocks = nn.ModuleList(WanBlock(cfg) for _ in range(cfg.depth))
        self.final = WanFinal(cfg)
        self.register_buffer("rope_cos", torch.empty(cfg.rope_max_seq_len, cfg.head_dim // 2), persistent=False)
        self.register_buffer("rope_sin", torch.empty(cfg.rope_max_seq_len, cfg.head_dim // 2), persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The rotary tables, which no checkpoint holds, beside the weights."""
        angles = rope_angles(self.cfg)
        device = self.patch_embed.weight.device
        self.rope_cos = angles.cos().to(device, torch.float32)
        self.rope_sin = angles.sin().to(device, torch.float32)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Wan's initialisation: Xavier-uniform linears and patch embedding, zero biases, N(0, 0.02) time and text
        projections, modulation tables N(0, 1/hidden), a zero output layer (a new model outputs zeros)."""
        self.init_buffers()
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and module.weight is not None:
                module.reset_parameters()
        xavier_as_linear(self.patch_embed.weight)
        nn.init.zeros_(self.patch_embed.bias)
        for layer in (self.time_mlp[0], self.time_mlp[2], self.time_proj, self.text_mlp[0], self.text_mlp[2]):
            nn.init.normal_(layer.weight, std=0.02)
        for table in [b.modulation for b in self.blocks] + [self.final.modulation]:
            nn.init.normal_(table, std=self.cfg.hidden_size ** -0.5)
        nn.init.zeros_(self.final.linear.weight)

    def rope(self, frames: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [frames·rows·cols, head_dim / 2] of the patch grid, tokens frame-major then row-major."""
        dt, dh, _ = (d // 2 for d in self.cfg.rope_dims)
        index = torch.cartesian_prod(*(torch.arange(n, device=self.rope_cos.device) for n in (frames, rows, cols)))

        def table(full: torch.Tensor) -> torch.Tensor:
            return torch.cat([full[index[:, 0], :dt], full[index[:, 1], dt:dt + dh], full[index[:, 2], dt + dh:]], 1)

        return table(self.rope_cos), table(self.rope_sin)

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor,
                context_mask: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() == 4:
            return self.forward(x.unsqueeze(2), t, context, context_mask).squeeze(2)
        cfg = self.cfg
        B, _, F_, H, W = x.shape
        (pt, ph, pw), limit = cfg.patch_size, cfg.rope_max_seq_len
        grid = (F_ // pt, H // ph, W // pw)
        if F_ % pt or H % ph or W % pw or max(grid) > limit:
            raise ValueError(f"Wan takes [B, C, F, H, W] inputs that {cfg.patch_size} patches divide, at most {limit} "
                             f"patches an axis; got {list(x.shape)}")
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2).contiguous()  # token-major rows for every matmul
        steps = t.float() * cfg.time_scale if t.is_floating_point() else t.float()
        temb = self.time_mlp(timestep_sinusoid(steps, cfg.freq_dim, 0.0).to(tokens.dtype))
        mod = self.time_proj(F.silu(temb)).unflatten(1, (6, -1))
        context = self.text_mlp(context.to(tokens.dtype))
        mask = None if context_mask is None else context_mask.bool()[:, None, None, :]
        rope = self.rope(*grid)
        for block in self.blocks:
            tokens = block(tokens, context, mod, rope, mask)
        out = self.final(tokens, temb)  # [B, N, p_t·p_h·p_w·C], each token's values ordered (p_t, p_h, p_w, C)
        out = out.view(B, *grid, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return out.reshape(B, -1, F_, H, W)
