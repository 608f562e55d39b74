"""A simulator from outside the package, for the plugin tests: a point on a plane pushed to a goal (pure numpy),
with a scripted expert, its eval runner and a transform. ``longboat data record --plugin``, an eval config's
``plugins:`` and a run config's ``plugins:`` import it."""

from __future__ import annotations

import numpy as np
import torch

from longboat.config.base import StrictModel
from longboat.data.robot.transforms import Transform, register_transform
from longboat.eval.runners import register_runner
from longboat.eval.runners.sim import SimRunner
from longboat.sim import SimEnv, register_simulator

TASKS = {"reach": 0.05, "reach_far": 0.02}  # task -> the distance to the goal that counts as success


@register_simulator("point", lambda: list(TASKS))
class PointSim(SimEnv):
    """State: the point's and the goal's (x, y); action: a step in [-1, 1]², scaled by 0.1."""

    robot_type = "point"
    cameras = ("top",)
    state_dim = 4
    action_dim = 2
    max_steps = 40
    fps = 10

    def __init__(self, task: str):
        super().__init__()
        self.name, self.task, self._tolerance = f"point:{task}", f"move the point to the goal ({task})", TASKS[task]
        self._pos = self._goal = np.zeros(2, np.float32)

    def _state(self) -> np.ndarray:
        return np.concatenate([self._pos, self._goal]).astype(np.float32)

    def reset(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        self._pos, self._goal = rng.uniform(-1, 1, 2).astype(np.float32), rng.uniform(-1, 1, 2).astype(np.float32)
        return self._state()

    def expert_action(self) -> np.ndarray:
        return np.clip((self._goal - self._pos) / 0.1, -1, 1).astype(np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        self._pos = np.clip(self._pos + 0.1 * np.clip(np.asarray(action, np.float32), -1, 1), -1, 1)
        distance = float(np.linalg.norm(self._goal - self._pos))
        return self._state(), -distance, distance < self._tolerance

    def physics(self):
        raise NotImplementedError("the point is drawn with numpy")

    def render(self, camera: str, size: int) -> np.ndarray:
        """White, the goal green, the point red."""
        image = np.full((size, size, 3), 255, np.uint8)
        for xy, colour in ((self._goal, (0, 200, 0)), (self._pos, (220, 0, 0))):
            col, row = ((np.asarray(xy) + 1) / 2 * (size - 1)).round().astype(int)
            image[max(row - 1, 0):row + 2, max(col - 1, 0):col + 2] = colour
        return image


@register_runner("point")
class PointRunner(SimRunner):
    """The point simulator's tasks in closed loop: the same ``SimEnv``, so observations match the recorded ones."""


class ScaleConfig(StrictModel):
    key: str
    factor: float


@register_transform("point_scale")
class PointScale(Transform):
    """Multiplies ``key`` by ``factor`` (inverted on the way out)."""

    Config = ScaleConfig
    invertible = True

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        return {**item, self.cfg.key: item[self.cfg.key] * self.cfg.factor}

    def unapply(self, item: dict) -> dict:
        return {**item, self.cfg.key: item[self.cfg.key] / self.cfg.factor}
