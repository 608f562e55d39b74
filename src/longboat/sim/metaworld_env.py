"""Meta-World v3 tasks (``metaworld:<task>-v3``) with Meta-World's own scripted policies as experts."""

from __future__ import annotations

import threading
import warnings

import numpy as np

from longboat.sim.env import SimEnv
from longboat.sim.optional import import_simulator
from longboat.sim.registry import register_simulator

# Task strings for the tasks the experts solve about every time; others are named after the task.
TASK_TEXT = {
    "reach-v3": "reach the goal position",
    "push-v3": "push the puck to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "drawer-open-v3": "open the drawer",
    "button-press-v3": "press the button",
}


def _tasks() -> list[str]:
    return sorted(import_simulator("metaworld.policies").ENV_POLICY_MAP)


_BENCHMARKS: dict[str, object] = {}  # task -> its MT1, in this process
_BUILDING = threading.Lock()  # one build at a time: MT1 seeds and restores numpy's global random state


def benchmark(task: str):
    """Meta-World's MT1 of ``task`` (its env class and 50 placements), built once per process: building it resets a
    simulator 50 times (about a second), and every env of the task in this process, through every episode, shares
    it. Deterministic (seed 0, numpy's global state restored), so a shared one places objects as a new one would."""
    with _BUILDING:  # evaluation lanes make their envs from threads of their own
        if task not in _BENCHMARKS:
            _BENCHMARKS[task] = import_simulator("metaworld").MT1(task, seed=0)
        return _BENCHMARKS[task]


def adopt_benchmark(task: str, built) -> None:
    """Use ``built``, the MT1 of ``task`` built by another process and sent here, as this process's."""
    _BENCHMARKS.setdefault(task, built)


@register_simulator("metaworld", _tasks)
class MetaWorldEnv(SimEnv):
    robot_type = "sawyer"
    cameras = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
    rotated_cameras = frozenset({"corner", "corner2", "corner3", "corner4"})  # their MJCF rolls them upside down
    state_dim, action_dim = 39, 4

    def __init__(self, task: str):
        super().__init__()
        policies = import_simulator("metaworld.policies")
        self.name, self._task_name = f"metaworld:{task}", task
        self.task = TASK_TEXT.get(task, task.removesuffix("-v3").replace("-", " "))
        self._benchmark = benchmark(task)
        self._env = self._benchmark.train_classes[task]()
        self._policy = policies.ENV_POLICY_MAP[task]()
        self.max_steps = int(self._env.max_path_length)
        self.fps = round(1 / self._env.dt)
        self._obs: np.ndarray | None = None

    def reset(self, seed: int) -> np.ndarray:
        tasks = self._benchmark.train_tasks  # 50 object/goal placements; the seed picks one and seeds the rest
        self._env.set_task(tasks[np.random.default_rng(seed).integers(len(tasks))])
        self._obs, _ = self._env.reset(seed=seed)
        return self._obs.astype(np.float32)

    def expert_action(self) -> np.ndarray:
        with warnings.catch_warnings():  # the policies warn when they ask for more than the actuators take
            warnings.filterwarnings("ignore", "Constant\\(s\\) may be too high")
            action = self._policy.get_action(self._obs)
        return np.clip(action, -1, 1).astype(np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        self._obs, reward, _, _, info = self._env.step(action)
        return self._obs.astype(np.float32), float(reward), bool(info["success"])

    def physics(self):
        return self._env.model, self._env.data

    def close(self) -> None:
        super().close()
        self._env.close()
