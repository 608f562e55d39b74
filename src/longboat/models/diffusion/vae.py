"""A KL-regularised image autoencoder (Stable Diffusion / SDXL / Flux VAE): images to a diagonal Gaussian over
latents and latents back to images, for diffusion in latent space.

The encoder is a 3×3 convolution, one stage per ``block_out_channels`` entry (``layers_per_block`` ResNet blocks,
then a stride-2 convolution except after the last stage), a middle of ResNet, single-head self-attention over all
positions, ResNet, and a GroupNorm-SiLU-convolution out to the Gaussian's mean and log-variance. The decoder mirrors
it with ``layers_per_block + 1`` ResNet blocks a stage and nearest-neighbour 2× upsampling. Randomness stays with the
caller: ``DiagonalGaussian.sample(noise)`` takes the noise, so a run keys it as it keys every other draw.

A diffusion model sees ``scale_latents(z) = (z - shift_factor) · scaling_factor``; ``unscale_latents`` undoes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from longboat.config.base import StrictModel

EPS = 1e-6  # every GroupNorm of these autoencoders


class VAEConfig(StrictModel):
    """The defaults are Stable Diffusion 1.x/2.x's VAE (SDXL's has the same layout and ``scaling_factor`` 0.13025;
    Flux's has 16 latent channels, no quant convolutions, ``scaling_factor`` 0.3611 and ``shift_factor`` 0.1159)."""

    in_channels: int = Field(default=3, gt=0)
    out_channels: int = Field(default=3, gt=0)
    block_out_channels: tuple[int, ...] = Field(default=(128, 256, 512, 512), min_length=1,
                                                description="channels of each resolution stage, finest first")
    layers_per_block: int = Field(default=2, gt=0, description="ResNet blocks per encoder stage (decoder: one more)")
    latent_channels: int = Field(default=4, gt=0)
    norm_num_groups: int = Field(default=32, gt=0)
    mid_block_attention: bool = Field(default=True, description="self-attention between the middle ResNet blocks")
    use_quant_conv: bool = Field(default=True, description="a 1×1 convolution after the encoder")
    use_post_quant_conv: bool = Field(default=True, description="a 1×1 convolution before the decoder")
    scaling_factor: float = Field(default=0.18215, gt=0, description="latents are scaled by it for diffusion")
    shift_factor: float | None = Field(default=None, description="subtracted before scaling; None: no shift")

    @model_validator(mode="after")
    def _check(self) -> VAEConfig:
        bad = [c for c in self.block_out_channels if c <= 0 or c % self.norm_num_groups]
        if bad:
            raise ValueError(f"block_out_channels {list(self.block_out_channels)}: each must be a positive multiple "
                             f"of norm_num_groups ({self.norm_num_groups}); {bad[0]} is not")
        return self

    @property
    def downsample_factor(self) -> int:
        """Image side / latent side."""
        return 2 ** (len(self.block_out_channels) - 1)


@dataclass
class DiagonalGaussian:
    """The encoder's posterior over latents [B, latent_channels, h, w] (or [B, z_dim, T, h, w] for video);
    ``logvar`` is clamped to [-30, 20]."""

    mean: torch.Tensor
    logvar: torch.Tensor

    @property
    def std(self) -> torch.Tensor:
        return torch.exp(0.5 * self.logvar)

    def sample(self, noise: torch.Tensor) -> torch.Tensor:
        """``mean + std · noise``; ``noise`` is standard normal, drawn by the caller, shaped like ``mean``."""
        if noise.shape != self.mean.shape:
            raise ValueError(f"noise {list(noise.shape)} must have the posterior's shape {list(self.mean.shape)}")
        return self.mean + self.std * noise

    def kl(self) -> torch.Tensor:
        """KL divergence to the standard normal, summed over each sample's latents: [B]."""
        dims = tuple(range(1, self.mean.ndim))
        return 0.5 * (self.mean.square() + self.logvar.exp() - 1.0 - self.logvar).sum(dim=dims)


class ResnetBlock(nn.Module):
    """GroupNorm-SiLU-conv twice, plus the input (through a 1×1 convolution when the width changes)."""

    def __init__(self, cin: int, cout: int, groups: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=EPS)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout, eps=EPS)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class SelfAttention(nn.Module):
    """One head as wide as the channels, over every position of the feature map, added to its input."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=EPS)
        self.q, self.k, self.v, self.o = (nn.Linear(channels, channels) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        h = self.norm(x).flatten(2).transpose(1, 2)[:, None]  # [B, 1 head, H·W, C]
        h = F.scaled_dot_product_attention(self.q(h), self.k(h), self.v(h))
        return x + self.o(h[:, 0]).transpose(1, 2).reshape(B, C, H, W)


class MidBlock(nn.Module):
    def __init__(self, channels: int, groups: int, attention: bool):
        super().__init__()
        self.res = nn.ModuleList(ResnetBlock(channels, channels, groups) for _ in range(2))
        self.attn = SelfAttention(channels, groups) if attention else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res[1](self.attn(self.res[0](x)))


class Downsample(nn.Module):
    """A stride-2 3×3 convolution, the input padded by one on the right and bottom only (an odd side rounds down)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Stage(nn.Module):
    """ResNet blocks at one resolution, then an optional change of resolution."""

    def __init__(self, cin: int, cout: int, layers: int, groups: int, resample: type[nn.Module] | None):
        super().__init__()
        self.res = nn.ModuleList(ResnetBlock(cin if i == 0 else cout, cout, groups) for i in range(layers))
        self.resample = resample(cout) if resample is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.res:
            x = block(x)
        return self.resample(x)


class Encoder(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        ch, g, last = cfg.block_out_channels, cfg.norm_num_groups, len(cfg.block_out_channels) - 1
        self.conv_in = nn.Conv2d(cfg.in_channels, ch[0], 3, padding=1)
        self.down = nn.ModuleList(Stage(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block, g,
                                        Downsample if i < last else None) for i in range(last + 1))
        self.mid = MidBlock(ch[-1], g, cfg.mid_block_attention)
        self.norm_out = nn.GroupNorm(g, ch[-1], eps=EPS)
        self.conv_out = nn.Conv2d(ch[-1], 2 * cfg.latent_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for stage in self.down:
            x = stage(x)
        return self.conv_out(F.silu(self.norm_out(self.mid(x))))


class Decoder(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        ch, g, last = cfg.block_out_channels[::-1], cfg.norm_num_groups, len(cfg.block_out_channels) - 1
        self.conv_in = nn.Conv2d(cfg.latent_channels, ch[0], 3, padding=1)
        self.mid = MidBlock(ch[0], g, cfg.mid_block_attention)
        self.up = nn.ModuleList(Stage(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block + 1, g,
                                      Upsample if i < last else None) for i in range(last + 1))
        self.norm_out = nn.GroupNorm(g, ch[-1], eps=EPS)
        self.conv_out = nn.Conv2d(ch[-1], cfg.out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.mid(self.conv_in(z))
        for stage in self.up:
            x = stage(x)
        return self.conv_out(F.silu(self.norm_out(x)))


class AutoencoderKL(nn.Module):
    """``encode(x [B, in_channels, H, W]) -> DiagonalGaussian`` over [B, latent_channels, H/f, W/f] (f:
    ``cfg.downsample_factor``), ``decode(z) -> [B, out_channels, H, W]``; ``forward(x, noise)`` reconstructs ``x``
    through a posterior sample (through its mean when ``noise`` is None)."""

    def __init__(self, cfg: VAEConfig):
        super().__init__()
        self.cfg = cfg
        z = cfg.latent_channels
        self.encoder = Encoder(cfg)
        self.quant_conv = nn.Conv2d(2 * z, 2 * z, 1) if cfg.use_quant_conv else nn.Identity()
        self.post_quant_conv = nn.Conv2d(z, z, 1) if cfg.use_post_quant_conv else nn.Identity()
        self.decoder = Decoder(cfg)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """PyTorch's default initialisation of every convolution, linear layer and GroupNorm (as diffusers')."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear, nn.GroupNorm)):
                module.reset_parameters()

    def init_buffers(self) -> None:
        """Nothing: every tensor of this model is a weight a checkpoint holds."""

    def encode(self, x: torch.Tensor) -> DiagonalGaussian:
        if x.ndim != 4 or x.shape[1] != self.cfg.in_channels:
            raise ValueError(f"AutoencoderKL encodes images [B, {self.cfg.in_channels}, H, W]; got {list(x.shape)}")
        mean, logvar = self.quant_conv(self.encoder(x)).chunk(2, dim=1)
        return DiagonalGaussian(mean, logvar.clamp(-30.0, 20.0))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        if z.ndim != 4 or z.shape[1] != self.cfg.latent_channels:
            raise ValueError(f"AutoencoderKL decodes latents [B, {self.cfg.latent_channels}, h, w]; "
                             f"got {list(z.shape)}")
        return self.decoder(self.post_quant_conv(z))

    def scale_latents(self, z: torch.Tensor) -> torch.Tensor:
        """Posterior latents to the diffusion model's scale."""
        return (z - (self.cfg.shift_factor or 0.0)) * self.cfg.scaling_factor

    def unscale_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The diffusion model's latents back to the decoder's scale."""
        return latents / self.cfg.scaling_factor + (self.cfg.shift_factor or 0.0)

    def forward(self, x: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        posterior = self.encode(x)
        return self.decode(posterior.mean if noise is None else posterior.sample(noise))
