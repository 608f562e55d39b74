"""DiT (Peebles & Xie, 2023): a class- or pooled-text-conditional diffusion transformer over image (or latent) patches.

Patches are embedded by a strided convolution plus a fixed 2-D sin-cos position embedding. The condition c is the
sum of a timestep embedding (sinusoid -> MLP) and a class embedding whose extra last row is the "null" class that
classifier-free guidance trains and samples with; with ``text_dim`` set, the masked mean of the text embeddings,
through a small MLP, is added to it instead of a class. Each block modulates its two LayerNorms with shift, scale and a
residual gate regressed from c (adaLN-Zero: the regressors start at zero, so every block starts as the identity);
a final adaLN layer and a linear layer, zero too, map tokens back to patches, so a new model outputs zeros.

Time convention: a float ``t`` is flow time in [0, 1] (``generative/flow_matching.py``: 0 data, 1 noise) and is
multiplied by ``time_scale`` (1000) before the sinusoid, so ``t = k / 1000`` lands where diffusers' DiT, trained on
DDPM timesteps 0..999, reads timestep k. An integer ``t`` is taken as timesteps already on that scale (what
``generative/ddpm.py``'s sampler passes). With ``learn_sigma`` the output has 2·in_channels channels: the
prediction first, then DiT's variance interpolation values.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from longboat.config.base import StrictModel


class DiTConfig(StrictModel):
    """The defaults are DiT-S/2 on 32x32x4 latents (256-pixel images through SD's VAE) with ImageNet's 1000 classes."""

    image_size: int = Field(default=32, gt=0, description="side of the (square) input, pixels or latent cells")
    in_channels: int = Field(default=4, gt=0)
    patch_size: int = Field(default=2, gt=0, description="side of a patch; image_size must divide by it")
    hidden_size: int = Field(default=384, gt=0, description="width of every token (a multiple of 4 and of num_heads)")
    depth: int = Field(default=12, gt=0, description="number of blocks")
    num_heads: int = Field(default=6, gt=0)
    mlp_ratio: float = Field(default=4.0, gt=0, description="MLP width / hidden_size")
    num_classes: int = Field(default=1000, ge=0,
                             description="class labels 0..num_classes-1; label num_classes is the null class")
    text_dim: int | None = Field(default=None, gt=0, description="pooled-text conditioning: the width of the text "
                                 "embeddings whose masked mean is projected into the condition (None: class "
                                 "labels)")
    learn_sigma: bool = Field(default=False, description="also output DiT's variance channels (out = 2·in channels)")
    qkv_bias: bool = True
    frequency_embedding_size: int = Field(default=256, gt=0, description="width of the timestep sinusoid (even)")
    time_scale: float = Field(default=1000.0, gt=0, description="a float time t in [0, 1] is embedded as t·time_scale")
    # diffusers' DiT divides the sinusoid's log-frequencies by (half - 1), the DiT paper's code by half.
    time_freq_shift: float = Field(default=1.0, ge=0,
                                   description="1: diffusers' timestep sinusoid; 0: the DiT paper's code")
    norm_eps: float = Field(default=1e-6, gt=0, description="eps of the attention and final LayerNorms")
    mlp_norm_eps: float | None = Field(default=None, gt=0,
                                       description="eps of the LayerNorm before the MLP; None: norm_eps "
                                                   "(diffusers' DiT uses 1e-5 there)")

    @model_validator(mode="after")
    def _check(self) -> DiTConfig:
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size ({self.image_size}) must be divisible by patch_size ({self.patch_size})")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.hidden_size % 4:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of 4 (2-D sin-cos positions)")
        if self.frequency_embedding_size % 2:
            raise ValueError(f"frequency_embedding_size ({self.frequency_embedding_size}) must be even")
        if self.time_freq_shift >= self.frequency_embedding_size // 2:
            raise ValueError(f"time_freq_shift ({self.time_freq_shift}) must be below frequency_embedding_size / 2")
        return self

    @property
    def out_channels(self) -> int:
        return 2 * self.in_channels if self.learn_sigma else self.in_channels

    @property
    def grid_size(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size ** 2

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def null_label(self) -> int:
        """The class index of "no class" (classifier-free guidance)."""
        return self.num_classes

    def num_params(self) -> int:
        h, m, patch = self.hidden_size, self.mlp_hidden, self.patch_size ** 2
        qkv = 3 * h * h + (3 * h if self.qkv_bias else 0)
        block = qkv + h * h + h + 2 * h * m + m + h + 6 * h * h + 6 * h
        return (self.depth * block + self.in_channels * patch * h + h + self.frequency_embedding_size * h + h
                + h * h + h + (self.num_classes + 1) * h + 2 * h * h + 2 * h + h * patch * self.out_channels
                + patch * self.out_channels + (self.text_dim * h + h + h * h + h if self.text_dim else 0))

    def describe(self) -> str:
        """One line for ``longboat models``."""
        return (f"{self.num_params() / 1e6:9.1f}M  blocks {self.depth:3d}  hidden {self.hidden_size:5d}  "
                f"heads {self.num_heads}  {self.in_channels}x{self.image_size}x{self.image_size} / patch "
                f"{self.patch_size}  " + (f"text {self.text_dim}" if self.text_dim else f"classes {self.num_classes}"))

    def flops_per_sample(self) -> float:
        """Training FLOPs (forward + backward, 3 × the forward's multiply-adds × 2) of one sample."""
        h, n, m = self.hidden_size, self.num_patches, self.mlp_hidden
        patch = self.patch_size ** 2
        block = n * (2 * h * 3 * h + 2 * h * h + 4 * h * m) + 4 * n * n * h + 2 * h * 6 * h
        forward = (self.depth * block + 2 * n * self.in_channels * patch * h + 2 * n * h * patch * self.out_channels
                   + 2 * h * 2 * h + 2 * (self.frequency_embedding_size * h + h * h)
                   + (2 * (self.text_dim * h + h * h) if self.text_dim else 0))
        return 3.0 * forward


def sincos_position_embedding(dim: int, grid: int) -> torch.Tensor:
    """Fixed 2-D sin-cos embedding [grid², dim] of a row-major patch grid, float64 on the CPU: the first half encodes
    each patch's column, the second its row, each as [sin(p·ω), cos(p·ω)] with ω_k = 10000^(-k / (dim / 4))."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64, device="cpu") / (dim / 4))
    pos = torch.arange(grid, dtype=torch.float64, device="cpu")
    angles = torch.outer(pos, omega)
    one_d = torch.cat([angles.sin(), angles.cos()], dim=1)  # [grid, dim / 2]
    columns = one_d.repeat(grid, 1)  # token r·grid + c reads column c
    rows = one_d.repeat_interleave(grid, dim=0)  # ... and row r
    return torch.cat([columns, rows], dim=1)


def timestep_sinusoid(steps: torch.Tensor, dim: int, freq_shift: float, max_period: float = 10000.0) -> torch.Tensor:
    """[cos(s·f), sin(s·f)] [B, dim] of float timesteps ``s`` [B], f_k = max_period^(-k / (dim/2 - freq_shift))."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=steps.device)
    freqs = torch.exp(exponent / (half - freq_shift))
    args = steps.float()[:, None] * freqs[None]
    return torch.cat([args.cos(), args.sin()], dim=-1)


def xavier_as_linear(weight: torch.Tensor) -> None:
    """Xavier-uniform init of a patch convolution's weight [out, in, *kernel] as the linear layer over flattened
    patches it is (fan-out ``out``, not ``out`` × kernel), without a view (a sharded DTensor may not have one)."""
    fan_in, fan_out = weight[0].numel(), weight.shape[0]
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(weight, -bound, bound)


class Attention(nn.Module):
    """Multi-head self-attention. The fused qkv projection's outputs are laid out head by head ([heads, 3, head_dim])
    so that splitting it column-wise over tensor-parallel ranks gives each rank whole heads' q, k and v."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.qkv_bias)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        # -1 heads: under tensor parallelism this rank's share of them.
        q, k, v = self.qkv(x).view(B, N, -1, 3, self.head_dim).permute(3, 0, 2, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(B, N, -1))


class MLP(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.mlp_hidden)
        self.fc2 = nn.Linear(cfg.mlp_hidden, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class DiTBlock(nn.Module):
    """x += gate₁ · attn(LN(x)·(1 + scale₁) + shift₁);  x += gate₂ · mlp(LN(x)·(1 + scale₂) + shift₂), the six
    vectors regressed from the condition by ``modulation``."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        h = cfg.hidden_size
        self.norm1 = nn.LayerNorm(h, elementwise_affine=False, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(h, elementwise_affine=False,
                                  eps=cfg.norm_eps if cfg.mlp_norm_eps is None else cfg.mlp_norm_eps)
        self.mlp = MLP(cfg)
        self.modulation = nn.Linear(h, 6 * h)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """``c``: SiLU of the condition [B, hidden]."""
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(c).unsqueeze(1).chunk(6, dim=-1)
        x = x + gate1 * self.attn(self.norm1(x) * (1 + scale1) + shift1)
        return x + gate2 * self.mlp(self.norm2(x) * (1 + scale2) + shift2)


class FinalLayer(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        h = cfg.hidden_size
        self.norm = nn.LayerNorm(h, elementwise_affine=False, eps=cfg.norm_eps)
        self.modulation = nn.Linear(h, 2 * h)
        self.linear = nn.Linear(h, cfg.patch_size ** 2 * cfg.out_channels)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.modulation(c).unsqueeze(1).chunk(2, dim=-1)
        return self.linear(self.norm(x) * (1 + scale) + shift)


class DiT(nn.Module):
    """``model(x [B, C, H, W], t [B], labels [B] | None) -> [B, out_channels, H, W]``.

    ``t``: float flow time in [0, 1] (scaled by ``time_scale``) or integer timesteps on the scale itself.
    ``labels``: class indices, ``cfg.null_label`` for "no class"; None: every sample unconditional.
    """

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.patch_embed = nn.Conv2d(cfg.in_channels, h, cfg.patch_size, cfg.patch_size)
        self.register_buffer("pos_embed", torch.empty(1, cfg.num_patches, h), persistent=False)
        self.time_mlp = nn.Sequential(nn.Linear(cfg.frequency_embedding_size, h), nn.SiLU(), nn.Linear(h, h))
        self.label_embed = nn.Embedding(cfg.num_classes + 1, h)
        if cfg.text_dim:  # pooled text -> the condition
            self.text_mlp = nn.Sequential(nn.Linear(cfg.text_dim, h), nn.SiLU(), nn.Linear(h, h))
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.final = FinalLayer(cfg)
        self.init_weights()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The fixed position embedding, which no checkpoint holds, placed beside the weights (off the meta device
        when they were assigned from a checkpoint)."""
        table = sincos_position_embedding(self.cfg.hidden_size, self.cfg.grid_size).unsqueeze(0)
        self.pos_embed = table.to(self.patch_embed.weight.device, torch.float32)

    @torch.no_grad()
    def init_weights(self) -> None:
        """DiT's initialisation (valid after ``to_empty``): Xavier-uniform linears and patch embedding with zero
        biases, N(0, 0.02) timestep MLP and class table, and zero adaLN regressors and output layer."""
        self.init_buffers()
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        xavier_as_linear(self.patch_embed.weight)
        nn.init.zeros_(self.patch_embed.bias)
        nn.init.normal_(self.label_embed.weight, std=0.02)
        for layer in (self.time_mlp[0], self.time_mlp[2]) + ((self.text_mlp[0], self.text_mlp[2])
                                                            if self.cfg.text_dim else ()):
            nn.init.normal_(layer.weight, std=0.02)
        for layer in [b.modulation for b in self.blocks] + [self.final.modulation, self.final.linear]:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def condition(self, t: torch.Tensor, cond: torch.Tensor | None, dtype: torch.dtype,
                  cond_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The condition c [B, hidden]: timestep embedding + class embedding, or + the projected masked mean of the
        text embeddings ``cond`` [B, L, text_dim] (mask [B, L], True: a real token) for a text-conditioned DiT."""
        steps = t.float() * self.cfg.time_scale if t.is_floating_point() else t.float()
        freq = timestep_sinusoid(steps, self.cfg.frequency_embedding_size, self.cfg.time_freq_shift)
        null = torch.full((t.shape[0],), self.cfg.null_label, dtype=torch.long, device=t.device)
        if not self.cfg.text_dim:
            return self.time_mlp(freq.to(dtype)) + self.label_embed(null if cond is None else cond)
        c = self.time_mlp(freq.to(dtype)) + self.label_embed(null)
        if cond is None:
            return c
        if cond_mask is None:
            pooled = cond.mean(1)
        else:
            weights = cond_mask.to(cond.dtype).unsqueeze(-1)
            pooled = (cond * weights).sum(1) / weights.sum(1).clamp(min=1)
        return c + self.text_mlp(pooled.to(dtype))

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """[B, grid², p·p·C] (each token's values ordered row, column, channel) -> [B, C, H, W]."""
        g, p, c = self.cfg.grid_size, self.cfg.patch_size, self.cfg.out_channels
        return x.view(-1, g, g, p, p, c).permute(0, 5, 1, 3, 2, 4).reshape(-1, c, g * p, g * p)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None = None,
                cond_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``cond``: class labels [B] (None: the null class), or text embeddings [B, L, text_dim] with their mask
        ``cond_mask`` [B, L] when ``text_dim`` is set (None: no text)."""
        cfg = self.cfg
        if tuple(x.shape[1:]) != (cfg.in_channels, cfg.image_size, cfg.image_size):
            raise ValueError(f"DiT takes [B, {cfg.in_channels}, {cfg.image_size}, {cfg.image_size}] inputs, "
                             f"got {list(x.shape)}")
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed.to(x.dtype)
        c = F.silu(self.condition(t, cond, tokens.dtype, cond_mask))
        for block in self.blocks:
            tokens = block(tokens, c)
        return self.unpatchify(self.final(tokens, c))
