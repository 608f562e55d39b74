"""Wan 2.1's causal 3-D video autoencoder: clips [B, C, T, H, W] to a diagonal Gaussian over latents
[B, z_dim, 1 + (T-1)/4, H/8, W/8] and back.

Every convolution over time is causal (zero frames before the first), so the first frame is encoded alone, as an
image, and the clip streams through in chunks that carry a cache of each convolution's last input frames: the first
frame, then 4 frames a chunk on encode, one latent frame a chunk on decode. The streamed result is the whole clip's,
while memory stays that of one chunk. Residual blocks normalise by RMS over channels; the encoder halves the sides at
each stage but the last, and at the stages ``temporal_downsample`` marks also the frames (a stride-2 causal
convolution over time that keeps the first frame); the decoder mirrors it (one causal convolution doubles the channels
into two frames per frame, the first frame excepted). Between them sits a per-frame single-head self-attention.

Diffusion sees ``scale_latents(z) = (z - latents_mean) / latents_std`` per channel; ``unscale_latents`` undoes it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from longboat.config.base import StrictModel
from longboat.models.diffusion.vae import DiagonalGaussian

# module -> its last input frames, the causal state carried from chunk to chunk (a temporal upsampler: True once
# the first frame has passed). One per encode or decode call.
Cache = dict
CHUNK = 4  # frames per encoder chunk after the first frame

WAN21_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
              -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
WAN21_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
             1.6382, 1.1253, 2.8251, 1.9160)


class WanVAEConfig(StrictModel):
    """The defaults are Wan 2.1's VAE (Wan-AI/Wan2.1-T2V-*-Diffusers ``vae/``): 126.9M parameters."""

    in_channels: int = Field(default=3, gt=0)
    out_channels: int = Field(default=3, gt=0)
    base_dim: int = Field(default=96, gt=0, description="encoder channels of the first stage")
    decoder_base_dim: int | None = Field(default=None, gt=0, description="the decoder's; None: base_dim")
    z_dim: int = Field(default=16, gt=0, description="latent channels")
    dim_mult: tuple[int, ...] = Field(default=(1, 2, 4, 4), min_length=1, description="stage widths / base_dim")
    num_res_blocks: int = Field(default=2, gt=0, description="residual blocks per encoder stage (decoder: one more)")
    temporal_downsample: tuple[bool, ...] = Field(default=(False, True, True),
                                                  description="per stage but the last: halve the frames too")
    latents_mean: tuple[float, ...] = WAN21_MEAN
    latents_std: tuple[float, ...] = WAN21_STD

    @model_validator(mode="after")
    def _check(self) -> WanVAEConfig:
        if len(self.temporal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(f"temporal_downsample has {len(self.temporal_downsample)} entries; it needs one per "
                             f"stage but the last ({len(self.dim_mult) - 1})")
        if sum(self.temporal_downsample) > 2:
            raise ValueError("temporal_downsample halves the frames at most twice (chunks of 4 frames stream)")
        if bad := [m for m in self.dim_mult if m <= 0]:
            raise ValueError(f"dim_mult entries must be positive; got {bad[0]}")
        for name in ("latents_mean", "latents_std"):
            if len(getattr(self, name)) != self.z_dim:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries; z_dim is {self.z_dim}")
        if any(s <= 0 for s in self.latents_std):
            raise ValueError("latents_std entries must be positive")
        return self

    @property
    def temporal_factor(self) -> int:
        return 2 ** sum(self.temporal_downsample)

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)

    def describe(self) -> str:
        return f"z_dim={self.z_dim} base_dim={self.base_dim} dim_mult={list(self.dim_mult)}"


class RMSNorm(nn.Module):
    """``x / ‖x‖ · √C · weight`` over the channel dimension 1 (fp32 for half-precision inputs)."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.scale = channels ** 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.dtype in (torch.float16, torch.bfloat16)
        x = F.normalize(x.float() if half else x, dim=1).to(x.dtype)
        return x * (self.scale * self.weight).view(-1, *([1] * (x.ndim - 2)))


class CausalConv3d(nn.Conv3d):
    """A 3-D convolution padded in space on both sides and in time only before the first frame. With a ``cache``
    the frames kept from the previous chunk replace the leading zeros, and this chunk's last ones are kept."""

    def __init__(self, cin: int, cout: int, kernel: int | tuple[int, int, int], stride: int | tuple = 1,
                 padding: int | tuple[int, int, int] = 0):
        super().__init__(cin, cout, kernel, stride=stride)
        pt, ph, pw = (padding,) * 3 if isinstance(padding, int) else padding
        self.time_pad, self.space_pad = 2 * pt, (pw, pw, ph, ph)

    def forward(self, x: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        pad = self.time_pad
        if pad and cache is not None:
            prev = cache.get(self)
            if prev is not None:
                x = torch.cat([prev, x], dim=2)
                pad -= prev.shape[2]
            cache[self] = x[:, :, -self.time_pad:].clone()
        return super().forward(F.pad(x, (*self.space_pad, pad, 0)))


class ResBlock(nn.Module):
    """RMSNorm-SiLU-causal conv twice, plus the input (through a 1×1×1 convolution when the width changes)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = RMSNorm(cin)
        self.conv1 = CausalConv3d(cin, cout, 3, padding=1)
        self.norm2 = RMSNorm(cout)
        self.conv2 = CausalConv3d(cout, cout, 3, padding=1)
        self.skip = CausalConv3d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)), cache)
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)), cache)


class Attention(nn.Module):
    """One head as wide as the channels over the positions of each frame, added to its input."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = RMSNorm(channels)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, T, H, W = x.shape
        h = self.norm(x).permute(0, 2, 3, 4, 1).reshape(B * T, 1, H * W, C)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        h = self.proj(F.scaled_dot_product_attention(q, k, v))
        return x + h.reshape(B, T, H, W, C).permute(0, 4, 1, 2, 3)


class MidBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.res = nn.ModuleList(ResBlock(channels, channels) for _ in range(2))
        self.attn = Attention(channels)

    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        return self.res[1](self.attn(self.res[0](x, cache)), cache)


def _per_frame(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A 2-D module applied to every frame of [B, C, T, H, W]."""
    B, _, T = x.shape[:3]
    y = conv(x.transpose(1, 2).flatten(0, 1))
    return y.unflatten(0, (B, T)).transpose(1, 2)


class Downsample(nn.Module):
    """Halve the sides (a stride-2 3×3 convolution, padded right and bottom); ``temporal``: then the frames, by a
    stride-2 causal convolution over time whose windows start at the first frame, which is kept as is."""

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)
        self.time_conv = CausalConv3d(channels, channels, (3, 1, 1), stride=(2, 1, 1)) if temporal else None

    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        x = _per_frame(self.conv, F.pad(x, (0, 1, 0, 1)))
        if self.time_conv is None:
            return x
        prev = cache.get(self)
        cache[self] = x[:, :, -1:].clone()
        if prev is None:  # the first chunk: the first frame passes alone
            return x
        return self.time_conv(torch.cat([prev, x], dim=2))


class Upsample(nn.Module):
    """``temporal``: first double the frames (a causal convolution to twice the channels, read as two frames per
    frame; the first frame stays one); then double the sides (nearest) and convolve to ``cout`` channels."""

    def __init__(self, channels: int, cout: int, temporal: bool):
        super().__init__()
        self.conv = nn.Conv2d(channels, cout, 3, padding=1)
        self.time_conv = CausalConv3d(channels, 2 * channels, (3, 1, 1), padding=(1, 0, 0)) if temporal else None

    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        if self.time_conv is not None:
            if self in cache:  # after the first frame; its frames are not the time convolution's context
                B, C, T, H, W = x.shape
                x = self.time_conv(x, cache).reshape(B, 2, C, T, H, W)
                x = x.permute(0, 2, 3, 1, 4, 5).reshape(B, C, 2 * T, H, W)
            else:
                cache[self] = True
        up = F.interpolate(x.transpose(1, 2).flatten(0, 1).float(), scale_factor=2.0, mode="nearest-exact")
        B, T = x.shape[0], x.shape[2]
        return self.conv(up.to(x.dtype)).unflatten(0, (B, T)).transpose(1, 2)


class Encoder(nn.Module):
    """``conv_in``, then ``down``: a flat sequence of residual blocks and downsamplers, then the middle and out."""

    def __init__(self, cfg: WanVAEConfig):
        super().__init__()
        dims = [cfg.base_dim * m for m in (1, *cfg.dim_mult)]
        self.conv_in = CausalConv3d(cfg.in_channels, dims[0], 3, padding=1)
        self.down = nn.ModuleList()
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            for j in range(cfg.num_res_blocks):
                self.down.append(ResBlock(cin if j == 0 else cout, cout))
            if i < len(cfg.dim_mult) - 1:
                self.down.append(Downsample(cout, cfg.temporal_downsample[i]))
        self.mid = MidBlock(dims[-1])
        self.norm_out = RMSNorm(dims[-1])
        self.conv_out = CausalConv3d(dims[-1], 2 * cfg.z_dim, 3, padding=1)

    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        x = self.conv_in(x, cache)
        for layer in self.down:
            x = layer(x, cache)
        return self.conv_out(F.silu(self.norm_out(self.mid(x, cache))), cache)


class UpStage(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int, upsample: Upsample | None):
        super().__init__()
        self.res = nn.ModuleList(ResBlock(cin if j == 0 else cout, cout) for j in range(blocks))
        self.upsample = upsample

    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        for block in self.res:
            x = block(x, cache)
        return x if self.upsample is None else self.upsample(x, cache)


class Decoder(nn.Module):
    """``conv_in``, the middle, then ``up``: stages of residual blocks each ending (but the last) in an upsampler
    that halves the channels."""

    def __init__(self, cfg: WanVAEConfig):
        super().__init__()
        base, last = cfg.decoder_base_dim or cfg.base_dim, len(cfg.dim_mult) - 1
        dims = [base * m for m in (cfg.dim_mult[-1], *cfg.dim_mult[::-1])]
        temporal = cfg.temporal_downsample[::-1]
        self.conv_in = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1)
        self.mid = MidBlock(dims[0])
        self.up = nn.ModuleList()
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            upsample = Upsample(cout, cout // 2, temporal[i]) if i < last else None
            self.up.append(UpStage(cin // 2 if i > 0 else cin, cout, cfg.num_res_blocks + 1, upsample))
        self.norm_out = RMSNorm(dims[-1])
        self.conv_out = CausalConv3d(dims[-1], cfg.out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor, cache: Cache) -> torch.Tensor:
        x = self.mid(self.conv_in(z, cache), cache)
        for stage in self.up:
            x = stage(x, cache)
        return self.conv_out(F.silu(self.norm_out(x)), cache)


class WanVAE(nn.Module):
    """``encode(x [B, in_channels, T, H, W]) -> DiagonalGaussian`` over [B, z_dim, 1 + (T-1)/t, H/s, W/s] (t, s:
    ``cfg.temporal_factor``, ``cfg.spatial_factor``; T must be 1 + 4k), ``decode(z) -> [B, out_channels, 1 +
    (T_z-1)·t, H, W]`` clamped to [-1, 1]; ``forward(x, noise)`` reconstructs ``x`` through a posterior sample
    (through its mean when ``noise`` is None)."""

    def __init__(self, cfg: WanVAEConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quant_conv = CausalConv3d(2 * cfg.z_dim, 2 * cfg.z_dim, 1)
        self.post_quant_conv = CausalConv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder(cfg)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """PyTorch's default initialisation of every convolution and linear layer, RMS norms at one (as diffusers')."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Conv3d, nn.Linear)):
                module.reset_parameters()
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def init_buffers(self) -> None:
        """Nothing: every tensor of this model is a weight a checkpoint holds."""

    def encode(self, x: torch.Tensor) -> DiagonalGaussian:
        if x.ndim != 5 or x.shape[1] != self.cfg.in_channels or (x.shape[2] - 1) % CHUNK:
            raise ValueError(f"WanVAE encodes clips [B, {self.cfg.in_channels}, 1 + 4k frames, H, W]; "
                             f"got {list(x.shape)}")
        cache: Cache = {}
        chunks = [x[:, :, :1]] + (list(x[:, :, 1:].split(CHUNK, dim=2)) if x.shape[2] > 1 else [])
        h = torch.cat([self.encoder(chunk, cache) for chunk in chunks], dim=2)
        mean, logvar = self.quant_conv(h).chunk(2, dim=1)
        return DiagonalGaussian(mean, logvar.clamp(-30.0, 20.0))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        if z.ndim != 5 or z.shape[1] != self.cfg.z_dim:
            raise ValueError(f"WanVAE decodes latents [B, {self.cfg.z_dim}, T, h, w]; got {list(z.shape)}")
        cache: Cache = {}
        z = self.post_quant_conv(z)
        x = torch.cat([self.decoder(frame, cache) for frame in z.split(1, dim=2)], dim=2)
        return x.clamp(-1.0, 1.0)

    def _stats(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, -1) + (1,) * (z.ndim - 2)
        mean = torch.tensor(self.cfg.latents_mean, device=z.device, dtype=z.dtype).view(shape)
        return mean, torch.tensor(self.cfg.latents_std, device=z.device, dtype=z.dtype).view(shape)

    def scale_latents(self, z: torch.Tensor) -> torch.Tensor:
        """Posterior latents to the diffusion model's scale: per channel ``(z - mean) / std``."""
        mean, std = self._stats(z)
        return (z - mean) / std

    def unscale_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The diffusion model's latents back to the decoder's scale."""
        mean, std = self._stats(latents)
        return latents * std + mean

    def forward(self, x: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        posterior = self.encode(x)
        return self.decode(posterior.mean if noise is None else posterior.sample(noise))
