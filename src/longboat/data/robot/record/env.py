"""The interface every recordable environment gives: state, expert action, cameras, reward and success."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from longboat.data.robot.record.render import CameraRenderer


class SimEnv(ABC):
    """One task of a simulator with its scripted expert. ``step`` returns (state, reward, success)."""

    name: str  # as the user wrote it, e.g. "fetch:push"
    task: str  # the dataset's task string
    robot_type: str
    cameras: tuple[str, ...]  # the first is the default
    state_dim: int
    action_dim: int
    max_steps: int  # the simulator's own episode limit
    fps: int  # control steps per second

    rotated_cameras: frozenset[str] = frozenset()  # rendered turned 180°

    def __init__(self):
        self._renderer: CameraRenderer | None = None
        self._renderer_size = 0

    @abstractmethod
    def reset(self, seed: int) -> np.ndarray: ...

    @abstractmethod
    def expert_action(self) -> np.ndarray: ...

    @abstractmethod
    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool]: ...

    @abstractmethod
    def physics(self) -> tuple[object, object]:
        """The MuJoCo (model, data) the cameras look at (a simulator drawn otherwise overrides ``render``)."""

    def render(self, camera: str, size: int) -> np.ndarray:
        """uint8 RGB [size, size, 3] of ``camera`` now."""
        model, data = self.physics()
        if self._renderer_size != size:
            self.close_renderer()
            self._renderer, self._renderer_size = CameraRenderer(model, size, self.rotated_cameras), size
        return self._renderer.render(data, camera)

    def close_renderer(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer, self._renderer_size = None, 0

    def close(self) -> None:
        self.close_renderer()
