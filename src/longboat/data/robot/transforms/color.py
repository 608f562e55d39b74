"""Colour jitter for RGB images in [0, 1]: brightness, contrast, saturation and hue, each with a factor drawn
per image (as torchvision's ColorJitter draws them, in this fixed order), in torch alone. Off outside training."""

from __future__ import annotations

from typing import Sequence

import torch
from pydantic import Field

from longboat.config.base import StrictModel
from longboat.data.robot.transforms.base import Transform, TransformError, as_images, image_of, register_transform

# ITU-R 601-2 luma, the grayscale PIL and torchvision use
_LUMA = (0.299, 0.587, 0.114)


class ColorJitterConfig(StrictModel):
    keys: list[str] = Field(min_length=1, description="RGB image features to jitter")
    brightness: float = Field(default=0.0, ge=0, description="factor drawn from [max(0, 1 - b), 1 + b]")
    contrast: float = Field(default=0.0, ge=0, description="factor drawn from [max(0, 1 - c), 1 + c]")
    saturation: float = Field(default=0.0, ge=0, description="factor drawn from [max(0, 1 - s), 1 + s]")
    hue: float = Field(default=0.0, ge=0, le=0.5, description="shift of the hue, in turns, drawn from [-h, h]")


def grayscale(rgb: torch.Tensor) -> torch.Tensor:
    """[..., 3, H, W] -> [..., 1, H, W]."""
    r, g, b = rgb.unbind(-3)
    return (_LUMA[0] * r + _LUMA[1] * g + _LUMA[2] * b).unsqueeze(-3)


def shift_hue(rgb: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """[N, 3, H, W] in [0, 1] with the HSV hue turned by ``shift`` (turns, broadcast as [N, 1, 1, 1]), keeping
    saturation and value. Only the hue is computed: each channel is value - chroma * clamp(min(k, 4 - k), 0, 1),
    k = (n + 6 hue) mod 6 with n = 5, 3, 1 for red, green, blue, and value·saturation is the chroma."""
    r, g, b = rgb[:, 0:1], rgb[:, 1:2], rgb[:, 2:3]
    value = rgb.amax(1, keepdim=True)
    chroma = value - rgb.amin(1, keepdim=True)
    safe = torch.where(chroma > 0, chroma, 1.0)  # grey pixels: the channel differences are 0, so is the hue
    # The largest channel picks the sextant (red 0, green 2, blue 4); the other two place the hue within it.
    sextant = torch.where(value == r, (g - b) / safe, torch.where(value == g, (b - r) / safe + 2, (r - g) / safe + 4))
    sextant = torch.remainder(sextant + 6 * shift, 6)
    k = torch.tensor([5.0, 3.0, 1.0], dtype=rgb.dtype, device=rgb.device).view(1, 3, 1, 1) + sextant
    k = torch.where(k >= 6, k - 6, k)  # k < 12: one wrap, cheaper than a remainder over three channels
    return value - chroma * torch.minimum(k, 4 - k).clamp(0, 1)


@register_transform("color_jitter")
class ColorJitter(Transform):
    Config = ColorJitterConfig

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        return self.jitter(item, [generator], per_sample=False)

    def apply_batch(self, batch: dict, generators: Sequence[torch.Generator | None]) -> dict:
        """On a CPU a sample's images at a time (they stay in cache through the four steps), on an accelerator all
        at once."""
        on_cpu = any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for k, v in batch.items()
                     if k in self.cfg.keys)
        return self.jitter(batch, generators, per_sample=on_cpu)

    def jitter(self, batch: dict, generators: Sequence[torch.Generator | None], per_sample: bool) -> dict:
        """Sample i's factors drawn from ``generators[i]`` as ``apply`` draws them (per key: brightness, contrast,
        saturation, hue, one per image each), applied sample by sample or to every image at once."""
        cfg = self.cfg
        if not self.training or not (cfg.brightness or cfg.contrast or cfg.saturation or cfg.hue):
            return batch
        out = dict(batch)
        for key in cfg.keys:
            images, lead = as_images(image_of(batch, key, self.name))
            if images.shape[1] != 3 and (cfg.contrast or cfg.saturation or cfg.hue):
                raise TransformError(f"{self.name}: '{key}' has {images.shape[1]} channels; contrast, saturation "
                                     f"and hue need RGB (3)")
            n = images.shape[0] // len(generators)  # images per sample
            draws = [self._draws(n, g) for g in generators]
            if per_sample:
                images = torch.cat([self._jitter(images[i * n:(i + 1) * n], d) for i, d in enumerate(draws)])
            else:
                images = self._jitter(images, [torch.cat(u) for u in zip(*draws)])
            out[key] = images.reshape(*lead, *images.shape[-3:])
        return out

    def _draws(self, n: int, generator: torch.Generator | None) -> list[torch.Tensor]:
        """Uniform numbers in [0, 1) [n], one per image for each factor set, in the order the factors apply."""
        cfg = self.cfg
        return [torch.rand(n, generator=generator) for spread in (cfg.brightness, cfg.contrast, cfg.saturation,
                                                                   cfg.hue) if spread]

    def _jitter(self, images: torch.Tensor, draws: list[torch.Tensor]) -> torch.Tensor:
        """[N, C, H, W] jittered by the factors ``draws`` give (each [N], as ``_draws`` makes them)."""
        cfg, draws = self.cfg, iter(draws)
        if cfg.brightness:
            images = (images * _scale(images, cfg.brightness, next(draws))).clamp(0, 1)
        if cfg.contrast:
            mean = grayscale(images).mean(dim=(-3, -2, -1), keepdim=True)
            images = _blend(images, mean, _scale(images, cfg.contrast, next(draws)))
        if cfg.saturation:
            images = _blend(images, grayscale(images), _scale(images, cfg.saturation, next(draws)))
        if cfg.hue:
            images = shift_hue(images, _between(images, -cfg.hue, cfg.hue, next(draws)))
        return images


def _scale(images: torch.Tensor, spread: float, u: torch.Tensor) -> torch.Tensor:
    return _between(images, max(0.0, 1 - spread), 1 + spread, u)


def _between(images: torch.Tensor, lo: float, hi: float, u: torch.Tensor) -> torch.Tensor:
    """Uniform numbers ``u`` [N] in [0, 1) mapped to [lo, hi], shaped to broadcast over the images [N, C, H, W]."""
    u = u.to(device=images.device, dtype=images.dtype)
    return (lo + (hi - lo) * u).view(-1, 1, 1, 1)


def _blend(images: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """factor · images + (1 - factor) · other, clipped to [0, 1] (factor 0: ``other``, 1: unchanged)."""
    return (factor * images + (1 - factor) * other).clamp(0, 1)
