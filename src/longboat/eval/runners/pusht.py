"""PushT (``gym-pusht``, in the ``sim`` extra): the task ``pusht``, observed as LeRobot's PushT dataset records it:
``observation.image`` uint8 [96, 96, 3] and ``observation.state`` (the agent's x, y); actions are target positions
in [0, 512]²; an episode succeeds when the T covers the goal (95%)."""

from __future__ import annotations

from functools import partial

import numpy as np

from longboat.data.robot.record.optional import import_simulator
from longboat.eval.runners.base import FRAME_INFO, STATE_FEATURE, ObservationSpec, Runner, register_runner

IMAGE_FEATURE = "observation.image"
PROMPT = "push the T-shaped block onto the target"


def _pusht_env(spec: ObservationSpec):
    gym = import_simulator("gymnasium")
    gym.register_envs(import_simulator("gym_pusht"))
    spaces = gym.spaces

    class PushTEnv(gym.Wrapper):
        def __init__(self):
            super().__init__(gym.make("gym_pusht/PushT-v0", obs_type="pixels_agent_pos", render_mode="rgb_array"))
            self.max_steps, self.fps, self.prompt = int(self.env.spec.max_episode_steps), 10, PROMPT
            inner = self.env.observation_space
            self.observation_space = spaces.Dict({
                STATE_FEATURE: spaces.Box(-np.inf, np.inf, inner["agent_pos"].shape, np.float32),
                IMAGE_FEATURE: inner["pixels"]})
            self._video = False

        def _observe(self, obs: dict, info: dict) -> tuple[dict, dict]:
            out = {STATE_FEATURE: obs["agent_pos"].astype(np.float32), IMAGE_FEATURE: obs["pixels"]}
            info = {"success": bool(info.get("is_success", False))}
            if self._video:
                info[FRAME_INFO] = obs["pixels"]
            return out, info

        def reset(self, *, seed=None, options=None):
            seed = int(seed) if seed is not None else 0
            self._video = seed in (options or {}).get("video_seeds", ())
            return self._observe(*self.env.reset(seed=seed))

        def step(self, action):
            obs, reward, _, _, info = self.env.step(np.asarray(action, dtype=np.float32))
            obs, info = self._observe(obs, info)
            return obs, float(reward), info["success"], False, info

    return PushTEnv()


@register_runner("pusht")
class PushTRunner(Runner):
    def tasks(self) -> list[str]:
        import_simulator("gym_pusht")
        return ["pusht"]

    def renders(self) -> bool:
        return True  # the env draws its pixels every step

    def env_fn(self, task: str, spec: ObservationSpec):
        return partial(_pusht_env, spec)
