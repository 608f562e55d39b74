"""Image geometry: resize keeping the aspect ratio and pad to a size (openpi's resize_with_pad), centre crop,
random crop. Images are float [..., C, H, W]; every image of the leading (batch, time) dimensions is treated
alike, and a random crop draws its own offset per image."""

from __future__ import annotations

from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt

from longboat.config.base import StrictModel
from longboat.data.robot.transforms.base import Transform, TransformError, as_images, image_of, register_transform


class ResizePadConfig(StrictModel):
    keys: list[str] = Field(min_length=1, description="image features to resize")
    size: tuple[PositiveInt, PositiveInt] = Field(description="[height, width] of the output")
    interpolation: Literal["bilinear", "nearest"] = "bilinear"
    antialias: bool = Field(default=True, description="low-pass before shrinking (bilinear only), as PIL does")
    pad_value: float = Field(default=0.0, description="the border's value (0: black for images in [0, 1])")


@register_transform("resize_pad")
class ResizePad(Transform):
    """Scale the image to fit inside ``size`` without distortion, then pad it evenly (the extra pixel of an odd
    margin goes to the bottom or right)."""

    Config = ResizePadConfig
    batchable = True

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        out = dict(item)
        height, width = self.cfg.size
        for key in self.cfg.keys:
            images, lead = as_images(image_of(item, key, self.name))
            h, w = images.shape[-2:]
            # Integer arithmetic: the longer side (relative to the target) fills it exactly, the other is floored.
            if w * height >= h * width:
                rh, rw = max(h * width // w, 1), width
            else:
                rh, rw = height, max(w * height // h, 1)
            if (rh, rw) != (h, w):
                if self.cfg.interpolation == "bilinear":
                    images = F.interpolate(images, size=(rh, rw), mode="bilinear", align_corners=False,
                                           antialias=self.cfg.antialias)
                else:
                    images = F.interpolate(images, size=(rh, rw), mode="nearest")
            top, left = (height - rh) // 2, (width - rw) // 2
            images = F.pad(images, (left, width - rw - left, top, height - rh - top), value=self.cfg.pad_value)
            out[key] = images.reshape(*lead, *images.shape[-3:])
        return out


class CropConfig(StrictModel):
    keys: list[str] = Field(min_length=1, description="image features to crop")
    size: tuple[PositiveInt, PositiveInt] = Field(description="[height, width] of the crop")
    centre: Literal["floor", "round"] = Field(default="floor", description="the centre crop's offset: half the "
                                              "room rounded down (floor) or to even (round, torchvision's)")


def _crop_offsets(images: torch.Tensor, size: tuple[int, int], key: str, transform: str) -> tuple[int, int]:
    """The room (rows, columns) a crop of ``size`` leaves; an image smaller than the crop is an error."""
    (h, w), (ch, cw) = images.shape[-2:], size
    if ch > h or cw > w:
        raise TransformError(f"{transform}: '{key}' is {h}x{w}, smaller than the crop {ch}x{cw}")
    return h - ch, w - cw


def _center_crop(item: dict, cfg: CropConfig, transform: str) -> dict:
    out = dict(item)
    ch, cw = cfg.size
    for key in cfg.keys:
        x = image_of(item, key, transform)
        room_h, room_w = _crop_offsets(x, cfg.size, key, transform)
        if cfg.centre == "round":  # torchvision's CenterCrop: Python's round, halves to even
            top, left = int(round(room_h / 2.0)), int(round(room_w / 2.0))
        else:
            top, left = room_h // 2, room_w // 2
        out[key] = x[..., top:top + ch, left:left + cw]
    return out


@register_transform("center_crop")
class CenterCrop(Transform):
    Config = CropConfig
    batchable = True

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        return _center_crop(item, self.cfg, self.name)


@register_transform("random_crop")
class RandomCrop(Transform):
    """A crop at a uniformly drawn position per image while training; the centre crop otherwise."""

    Config = CropConfig

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        return self.apply_batch(item, [generator])

    def apply_batch(self, batch: dict, generators: Sequence[torch.Generator | None]) -> dict:
        """Sample i's offsets drawn from ``generators[i]`` as ``apply`` draws them (per key: its images' rows, then
        their columns)."""
        if not self.training:
            return _center_crop(batch, self.cfg, self.name)
        out = dict(batch)
        for key in self.cfg.keys:
            images, lead = as_images(image_of(batch, key, self.name))
            room_h, room_w = _crop_offsets(images, self.cfg.size, key, self.name)
            n = images.shape[0] // len(generators)  # images per sample
            tops, lefts = [], []
            for g in generators:
                tops += torch.randint(0, room_h + 1, (n,), generator=g).tolist()
                lefts += torch.randint(0, room_w + 1, (n,), generator=g).tolist()
            crops = crop_each(images, tops, lefts, self.cfg.size)
            out[key] = crops.reshape(*lead, *crops.shape[-3:])
        return out


def crop_each(images: torch.Tensor, tops: list[int], lefts: list[int], size: tuple[int, int]) -> torch.Tensor:
    """[N, C, H, W] -> [N, C, *size], image i cut at (tops[i], lefts[i])."""
    ch, cw = size
    if images.device.type == "cpu":
        # A loop over images, each a strided copy: faster on CPU than any gather of their pixels.
        return torch.stack([im[:, t:t + ch, l:l + cw] for im, t, l in zip(images, tops, lefts)])
    return gather_crops(images, tops, lefts, size)


def gather_crops(images: torch.Tensor, tops: list[int], lefts: list[int], size: tuple[int, int]) -> torch.Tensor:
    """``crop_each`` as one gather of every crop's pixels: on an accelerator, one kernel instead of one per image."""
    ch, cw = size
    rows = torch.tensor(tops, device=images.device)[:, None] + torch.arange(ch, device=images.device)
    cols = torch.tensor(lefts, device=images.device)[:, None] + torch.arange(cw, device=images.device)
    n = torch.arange(images.shape[0], device=images.device)[:, None, None]
    return images.permute(0, 2, 3, 1)[n, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
