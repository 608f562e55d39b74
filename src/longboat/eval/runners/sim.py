"""Runners over the simulators ``longboat data record`` records (``metaworld``, ``fetch``, ``pusht``): the same
``SimEnv`` classes, cameras and renderer, so evaluation observations match the recorded ones."""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from longboat.eval.runners.base import (FRAME_INFO, IMAGE_PREFIX, STATE_FEATURE, ObservationSpec, Runner,
                                        RunnerSetupError, register_runner)
from longboat.sim.metaworld_env import adopt_benchmark, benchmark
from longboat.sim.optional import import_simulator
from longboat.sim.registry import SIMULATORS, make_env


def _sim_task_env(env_name: str, spec: ObservationSpec, bounds: tuple[float, float]):
    """A ``gymnasium.Env`` over the recording environment ``env_name`` (defined on first use: gymnasium is part of
    the optional simulator extra)."""
    gym = import_simulator("gymnasium")
    spaces = gym.spaces

    class SimTaskEnv(gym.Env):
        def __init__(self):
            self.sim = make_env(env_name)
            self.max_steps, self.fps, self.prompt = self.sim.max_steps, self.sim.fps, self.sim.task
            self.cameras = {key: camera or self.sim.cameras[0] for key, camera in spec.cameras.items()}
            self.video_camera = spec.video_camera or self.sim.cameras[0]
            self.state_dim = spec.state_dim or self.sim.state_dim
            if self.state_dim < self.sim.state_dim:
                raise RunnerSetupError(f"{env_name}: the policy reads a state of {self.state_dim}, the simulator gives "
                                 f"{self.sim.state_dim}")
            missing = [c for c in dict.fromkeys([*self.cameras.values(), self.video_camera]) if c not in self.sim.cameras]
            if missing:
                raise RunnerSetupError(f"{env_name} has no camera {', '.join(missing)}; its cameras: "
                                 f"{', '.join(self.sim.cameras)}")
            size = spec.image_size
            self.observation_space = spaces.Dict({
                STATE_FEATURE: spaces.Box(-np.inf, np.inf, (self.state_dim,), np.float32),
                **{IMAGE_PREFIX + key: spaces.Box(0, 255, (size, size, 3), np.uint8) for key in spec.cameras}})
            self.action_space = spaces.Box(*bounds, (self.sim.action_dim,), np.float32)
            self._video = False

        def _observe(self, state: np.ndarray) -> dict:
            obs = {STATE_FEATURE: np.pad(state, (0, self.state_dim - state.size)).astype(np.float32)}
            for key, camera in self.cameras.items():
                obs[IMAGE_PREFIX + key] = self.sim.render(camera, spec.image_size)
            return obs

        def _info(self, **info) -> dict:
            if self._video:
                info[FRAME_INFO] = self.sim.render(self.video_camera, spec.video_size)
            return info

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            seed = int(seed) if seed is not None else 0
            self._video = seed in (options or {}).get("video_seeds", ())
            state = self.sim.reset(seed)
            return self._observe(state), self._info()

        def step(self, action):
            state, reward, success = self.sim.step(np.asarray(action, dtype=np.float32))
            return self._observe(state), reward, success, False, self._info(success=success)

        def close(self):
            self.sim.close()

    return SimTaskEnv()


class SimRunner(Runner):
    action_bounds = (-1.0, 1.0)

    def tasks(self) -> list[str]:
        return SIMULATORS[self.name].tasks()

    def sizes(self, task: str) -> tuple[int | None, int | None]:
        sim = SIMULATORS[self.name].make  # the SimEnv class: a size it sets per task (Fetch's state) is unknown here
        return getattr(sim, "state_dim", None), getattr(sim, "action_dim", None)

    def env_fn(self, task: str, spec: ObservationSpec):
        return partial(_sim_task_env, f"{self.name}:{task}", spec, self.action_bounds)


@register_runner("metaworld")
class MetaWorldRunner(SimRunner):
    """Meta-World v3 (MuJoCo, headless EGL, the recorder's camera fixes); tasks as ``reach-v3``."""

    simulator_modules = ("metaworld.policies",)  # and metaworld

    def env_fn(self, task: str, spec: ObservationSpec):
        # The task's benchmark is built here once and sent along to each env's process (about 16 kB), where
        # building it again would cost each about a second.
        return partial(_with_benchmark, task, benchmark(task), super().env_fn(task, spec))


def _with_benchmark(task: str, built, make: Callable[[], object]):
    adopt_benchmark(task, built)
    return make()


@register_runner("fetch")
class FetchRunner(SimRunner):
    """gymnasium-robotics Fetch: ``reach``, ``push``, ``pick_and_place``."""

    simulator_modules = ("gymnasium_robotics",)
    # FetchEnv learns its state size from a first reset: observation + desired goal, per task
    state_dims = {"reach": 13, "push": 28, "pick_and_place": 28}

    def sizes(self, task: str) -> tuple[int | None, int | None]:
        return self.state_dims.get(task), super().sizes(task)[1]


@register_runner("pusht")
class PushTRunner(SimRunner):
    """gym-pusht's Push-T (``push_t``): actions are the pusher's target in [0, 512]²."""

    action_bounds = (0.0, 512.0)
    simulator_modules = ("gym_pusht",)
