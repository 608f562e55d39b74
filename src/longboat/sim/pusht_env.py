"""gym-pusht's Push-T (``pusht:push_t``, 2-D pymunk physics drawn with pygame) with our expert."""

from __future__ import annotations

import numpy as np

from longboat.sim.env import SimEnv
from longboat.sim.optional import import_simulator
from longboat.sim.pusht_expert import PushTExpert
from longboat.sim.registry import register_simulator


@register_simulator("pusht", lambda: ["push_t"])
class PushTSim(SimEnv):
    robot_type = "pusht"
    cameras = ("top",)
    state_dim = 5  # pusher x, y; block x, y, angle
    action_dim = 2  # the pusher's target x, y
    task = "push the T-shaped block onto the green target"

    def __init__(self, task: str):
        super().__init__()
        gym = import_simulator("gymnasium")
        import_simulator("gym_pusht")
        self.name = f"pusht:{task}"
        self._env = gym.make("gym_pusht/PushT-v0", obs_type="state")
        self._u = self._env.unwrapped
        self.max_steps = int(self._env.spec.max_episode_steps)
        self.fps = int(self._u.metadata["render_fps"])
        self._expert = PushTExpert()
        self._obs = None

    def reset(self, seed: int) -> np.ndarray:
        self._obs, _ = self._env.reset(seed=seed)
        self._expert.reset(seed)
        return self._obs.astype(np.float32)

    def expert_action(self) -> np.ndarray:
        return self._expert.action(self._u)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        self._obs, reward, _, _, info = self._env.step(action)
        return self._obs.astype(np.float32), float(reward), bool(info["is_success"])

    def render(self, camera: str, size: int) -> np.ndarray:
        """The environment's own top-down drawing, resized as it resizes its pixel observations."""
        return np.ascontiguousarray(self._u._get_img(self._u._draw(), width=size, height=size))

    def physics(self):
        raise NotImplementedError("pusht draws with pygame; render() does not use MuJoCo physics")

    def close(self) -> None:
        super().close()
        self._env.close()
