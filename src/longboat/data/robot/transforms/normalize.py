"""Per-feature normalisation from dataset statistics, and its exact inverse for model outputs.

``mean_std``: (x - mean) / (std + eps). ``min_max``: min..max to [-1, 1]. ``quantiles``: q01..q99 to [-1, 1],
as openpi normalises (values beyond the quantiles land outside [-1, 1]; nothing is clipped, so the inverse is
exact). ``identity``: left as it is. Statistics broadcast against the feature's trailing dimensions: [D] for
vectors, (C, 1, 1) per channel for images.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from longboat.config.base import ConfigError, StrictModel
from longboat.data.robot.transforms.base import Stats, Transform, TransformError, register_transform

Mode = Literal["mean_std", "min_max", "quantiles", "identity"]
# mode -> (the stat x is measured from, the stat bounding its range); min_max and quantiles map to [-1, 1]
_STATS: dict[str, tuple[str, str]] = {"mean_std": ("mean", "std"), "min_max": ("min", "max"),
                                      "quantiles": ("q01", "q99")}


class NormalizeConfig(StrictModel):
    features: dict[str, Mode] = Field(min_length=1, description="feature -> mean_std | min_max | quantiles | identity")
    eps: float = Field(default=1e-6, ge=0, description="added to std or to the range, as openpi does")


@register_transform("normalize")
class Normalize(Transform):
    Config = NormalizeConfig
    batchable = True
    invertible = True

    @classmethod
    def needs(cls, cfg: NormalizeConfig) -> list[tuple[str, str]]:
        return [(f, s) for f, mode in cfg.features.items() if mode in _STATS for s in _STATS[mode]]

    def __init__(self, cfg: NormalizeConfig, stats: Stats):
        super().__init__(cfg, stats)
        # feature -> (offset, span, to_pm1): y = (x - offset) / span, then * 2 - 1 for the [-1, 1] modes
        self._affine: dict[str, tuple[torch.Tensor, torch.Tensor, bool]] = {}
        for feature, mode in cfg.features.items():
            if mode == "identity":
                continue
            lo, hi = (stats[feature][s] for s in _STATS[mode])
            span = hi + cfg.eps if mode == "mean_std" else hi - lo + cfg.eps
            if lo.shape != hi.shape or not bool((span > 0).all()):
                raise ConfigError(f"normalize: the stats of '{feature}' give a {mode} range that is not positive "
                                  f"(shapes {list(lo.shape)}, {list(hi.shape)}); set eps > 0 or use identity")
            self._affine[feature] = (lo, span, mode != "mean_std")

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        out = dict(item)
        for feature, (offset, span, to_pm1) in self._affine.items():
            if feature in item:
                x = _checked(item[feature], offset, feature)
                offset, span = offset.to(x.device), span.to(x.device)  # no copy when already there
                y = (x - offset).div_(span)  # in place on the new tensor: one image-sized allocation, not three
                out[feature] = y.mul_(2).sub_(1) if to_pm1 else y
        return out

    def unapply(self, item: dict) -> dict:
        out = dict(item)
        for feature, (offset, span, to_pm1) in self._affine.items():
            if feature in item:
                y = _checked(item[feature], offset, feature)
                offset, span = offset.to(y.device), span.to(y.device)
                out[feature] = ((y + 1) / 2 if to_pm1 else y) * span + offset
        return out


def _checked(x: torch.Tensor, stat: torch.Tensor, feature: str) -> torch.Tensor:
    """``x`` as float32, checked to end in the statistics' shape (a size-1 stat dimension broadcasts)."""
    tail = x.shape[x.ndim - stat.ndim:] if x.ndim >= stat.ndim else None
    if tail is None or any(s not in (1, t) for s, t in zip(stat.shape, tail)):
        raise TransformError(f"normalize: '{feature}' has shape {list(x.shape)}, which does not end in its "
                             f"stats' shape {list(stat.shape)}")
    return x.to(torch.float32)
