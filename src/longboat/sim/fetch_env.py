"""Fetch tasks of gymnasium-robotics (``fetch:reach``, ``fetch:push``, ``fetch:pick_and_place``) with our experts."""

from __future__ import annotations

import numpy as np

from longboat.sim.env import SimEnv
from longboat.sim.fetch_experts import EXPERTS
from longboat.sim.optional import import_simulator
from longboat.sim.registry import register_simulator

GYM_IDS = {"reach": "FetchReach-v4", "push": "FetchPush-v4", "pick_and_place": "FetchPickAndPlace-v4"}
TASK_TEXT = {"reach": "move the gripper to the red target", "push": "push the block to the red target",
             "pick_and_place": "pick up the block and place it at the red target"}


@register_simulator("fetch", lambda: list(GYM_IDS))
class FetchEnv(SimEnv):
    robot_type = "fetch"
    cameras = ("external_camera_0", "head_camera_rgb", "gripper_camera_rgb")
    action_dim = 4

    def __init__(self, task: str):
        super().__init__()
        gym = import_simulator("gymnasium")
        gym.register_envs(import_simulator("gymnasium_robotics"))
        self.name, self._task_name, self.task = f"fetch:{task}", task, TASK_TEXT[task]
        self._env = gym.make(GYM_IDS[task])
        self._expert = EXPERTS[task]
        self.max_steps = int(self._env.spec.max_episode_steps)
        self.fps = round(1 / self._env.unwrapped.dt)
        obs, _ = self._env.reset(seed=0)
        self.state_dim = obs["observation"].size + obs["desired_goal"].size
        self._obs = obs

    def _state(self) -> np.ndarray:
        return np.concatenate([self._obs["observation"], self._obs["desired_goal"]]).astype(np.float32)

    def reset(self, seed: int) -> np.ndarray:
        self._obs, _ = self._env.reset(seed=seed)
        return self._state()

    def expert_action(self) -> np.ndarray:
        return self._expert(self._obs["observation"], self._obs["desired_goal"])

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        self._obs, reward, _, _, info = self._env.step(action)
        return self._state(), float(reward), bool(info["is_success"])

    def physics(self):
        u = self._env.unwrapped
        return u.model, u.data

    def close(self) -> None:
        super().close()
        self._env.close()
