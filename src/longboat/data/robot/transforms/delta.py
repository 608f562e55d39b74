"""Relative actions: chosen action dimensions become offsets from the current state, and back.

The inverse needs the state the offsets were taken from, so ``unapply`` reads it from the item: at inference the
model's action is put into the observation item that ``apply`` produced, and the pipeline's ``unapply`` restores
the state (un-normalised, un-padded) before this step adds it back.
"""

from __future__ import annotations

import torch
from pydantic import Field, NonNegativeInt

from longboat.config.base import StrictModel
from longboat.data.robot.transforms.base import Transform, TransformError, register_transform, vector_of


class DeltaActionsConfig(StrictModel):
    action_key: str = "action"
    state_key: str = "observation.state"
    dims: list[NonNegativeInt] | None = Field(
        default=None, description="action dimensions made relative (e.g. joints, not the gripper); null: all")


@register_transform("delta_actions")
class DeltaActions(Transform):
    Config = DeltaActionsConfig
    batchable = True
    invertible = True

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        return self._shift(item, -1.0)

    def unapply(self, item: dict) -> dict:
        return self._shift(item, 1.0)

    def _shift(self, item: dict, sign: float) -> dict:
        """The action [..., H, D] plus ``sign`` times the current state on the chosen dimensions."""
        akey, skey = self.cfg.action_key, self.cfg.state_key
        if akey not in item:
            return item
        if skey not in item:
            raise TransformError(f"{self.name}: the item has '{akey}' but no '{skey}' to make it "
                                 f"{'absolute' if sign > 0 else 'relative'}; pass the applied observation with it")
        action = vector_of(item, akey, self.name, min_dims=2).to(torch.float32)
        state = vector_of(item, skey, self.name).to(torch.float32)
        if state.ndim == action.ndim:  # a state history [..., T, D]: the current state is the last
            state = state[..., -1, :]
        if state.shape[:-1] != action.shape[:-2]:
            raise TransformError(f"{self.name}: '{skey}' {list(state.shape)} does not match '{akey}' "
                                 f"{list(action.shape)} ([..., D] or [..., T, D] against [..., H, D])")
        dims = self.cfg.dims if self.cfg.dims is not None else list(range(action.shape[-1]))
        if dims and max(dims) >= min(action.shape[-1], state.shape[-1]):
            raise TransformError(f"{self.name}: dims {dims} reach past '{akey}' ({action.shape[-1]}) or "
                                 f"'{skey}' ({state.shape[-1]})")
        idx = torch.tensor(dims, dtype=torch.long, device=action.device)
        out = dict(item)
        shifted = action.clone()
        shifted[..., idx] = action[..., idx] + sign * state[..., idx].unsqueeze(-2)
        out[akey] = shifted
        return out
