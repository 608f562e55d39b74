"""Padding to a model's fixed sizes: state and action dimensions zero-padded to its largest (sliced back for
the robot), and action chunks padded to its horizon with a mask of the padded steps."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt

from longboat.config.base import ConfigError, StrictModel
from longboat.data.robot.transforms.base import Stats, Transform, TransformError, register_transform, vector_of


class PadDimConfig(StrictModel):
    keys: list[str] = Field(min_length=1, description="vector features to pad, e.g. observation.state, action")
    dim: PositiveInt = Field(description="the model's size of the last dimension")


@register_transform("pad_dim")
class PadDim(Transform):
    """Zero-pad the last dimension to ``dim``; ``unapply`` slices model outputs back to the feature's own size,
    which the dataset statistics give (so a served policy needs no item from training to know it)."""

    Config = PadDimConfig
    batchable = True
    invertible = True

    @classmethod
    def needs(cls, cfg: PadDimConfig) -> list[tuple[str, str]]:
        return [(key, "mean") for key in cfg.keys]

    def __init__(self, cfg: PadDimConfig, stats: Stats):
        super().__init__(cfg, stats)
        self._sizes = {key: stats[key]["mean"].numel() for key in cfg.keys}  # stats are shaped like [D]
        for key, size in self._sizes.items():
            if size > cfg.dim:
                raise ConfigError(f"pad_dim: '{key}' has {size} dimensions (its stats), more than dim={cfg.dim}")

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        out = dict(item)
        for key, size in self._sizes.items():
            if key in item:
                x = self._sized(item, key, size)
                out[key] = F.pad(x, (0, self.cfg.dim - size))
        return out

    def unapply(self, item: dict) -> dict:
        out = dict(item)
        for key, size in self._sizes.items():
            if key in item:
                out[key] = self._sized(item, key, self.cfg.dim)[..., :size]
        return out

    def _sized(self, item: dict, key: str, size: int) -> torch.Tensor:
        x = vector_of(item, key, self.name)
        if x.shape[-1] != size:
            raise TransformError(f"{self.name}: '{key}' has {x.shape[-1]} dimensions, expected {size}")
        return x


class PadHorizonConfig(StrictModel):
    key: str = Field(default="action", description="the chunk [..., T, D] to pad")
    horizon: PositiveInt = Field(description="the model's chunk length H")
    fill: Literal["last", "zeros"] = Field(default="last", description="repeat the last step, or zeros")


@register_transform("pad_horizon")
class PadHorizon(Transform):
    """Pad a chunk of T <= H steps to H and write ``<key>_is_pad`` ([..., H], true on padded steps, keeping the
    dataset's own mask for the first T). A chunk longer than H is an error: the dataset's chunk and the model's
    horizon disagree."""

    Config = PadHorizonConfig
    batchable = True

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        key, horizon = self.cfg.key, self.cfg.horizon
        if key not in item:
            return item
        x = vector_of(item, key, self.name, min_dims=2)
        steps = x.shape[-2]
        if steps > horizon:
            raise TransformError(f"{self.name}: '{key}' has {steps} steps, more than horizon={horizon}")
        mask_key = f"{key}_is_pad"
        mask = item.get(mask_key)
        if mask is None:
            mask = torch.zeros(x.shape[:-1], dtype=torch.bool, device=x.device)
        elif not isinstance(mask, torch.Tensor) or mask.shape != x.shape[:-1]:
            got = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise TransformError(f"{self.name}: '{mask_key}' must have shape {list(x.shape[:-1])}, got {got}")
        out = dict(item)
        if steps < horizon:
            extra = horizon - steps
            tail = x[..., -1:, :] if self.cfg.fill == "last" else torch.zeros_like(x[..., -1:, :])
            x = torch.cat((x, tail.expand(*x.shape[:-2], extra, x.shape[-1])), -2)
            mask = torch.cat((mask.bool(), mask.new_ones((*mask.shape[:-1], extra), dtype=torch.bool)), -1)
        out[key], out[mask_key] = x, mask.bool()
        return out
