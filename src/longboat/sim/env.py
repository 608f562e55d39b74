"""The interface every recordable environment gives: state, expert action, cameras, reward and success."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from longboat.sim.render import CameraRenderer


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
        self._renderers: dict[int, CameraRenderer] = {}  # by size: an eval renders policy frames and video frames

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
        if size not in self._renderers:
            self._renderers[size] = CameraRenderer(model, size, self.rotated_cameras)
        return self._renderers[size].render(data, camera)

    def close_renderer(self) -> None:
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers.clear()

    def close(self) -> None:
        self.close_renderer()
