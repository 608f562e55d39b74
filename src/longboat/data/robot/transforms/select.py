"""Keep chosen dimensions of a vector feature, e.g. a robot's own proprioception out of a simulator's full state.

Meta-World's 39-d state also holds the object and goal positions; a policy meant to work from pixels keeps only
the hand position and gripper (``dims: [0, 1, 2, 3]``) and must find the rest in its cameras. The dataset stays
whole, so one recording serves state and pixel policies alike. Statistics are of the whole feature: list this
step after ``normalize``. The dropped dimensions cannot come back, so the inverse removes the feature: the steps
before this one then never meet a feature shaped unlike their statistics.
"""

from __future__ import annotations

import torch
from pydantic import Field, NonNegativeInt

from longboat.config.base import StrictModel
from longboat.data.robot.transforms.base import Transform, TransformError, register_transform, vector_of


class SelectDimsConfig(StrictModel):
    key: str = Field(default="observation.state", description="the feature whose last dimension is selected")
    dims: list[NonNegativeInt] = Field(min_length=1, description="indices kept, in this order")


@register_transform("select_dims")
class SelectDims(Transform):
    Config = SelectDimsConfig
    batchable = True
    invertible = True

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        key = self.cfg.key
        if key not in item:  # e.g. an action-only item on its way back
            return item
        x = vector_of(item, key, self.name)
        if max(self.cfg.dims) >= x.shape[-1]:
            raise TransformError(f"{self.name}: dims {self.cfg.dims} reach past '{key}', which has "
                                 f"{x.shape[-1]} dimensions")
        return {**item, key: x[..., self.cfg.dims]}

    def unapply(self, item: dict) -> dict:
        return {k: v for k, v in item.items() if k != self.cfg.key}
