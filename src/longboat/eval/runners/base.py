"""The runner interface: one benchmark's environments behind gymnasium vector envs, observations as policy
requests, chunk rows as env actions.

A runner builds, per task, environments whose observation is a dict of dataset features (exactly what ``longboat
data record`` writes for that simulator: ``observation.state`` and ``observation.images.<camera>`` uint8
[H, W, 3]), so a policy trained on recorded data sees the same layout in closed loop. ``request`` renames the
features to the policy's wire keys; ``action`` fits a row of the action chunk to the environment. Each env reports
``success`` in its step info; episodes end on the first success, as recorded episodes do.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Literal

import numpy as np

from longboat.config.base import ConfigError
from longboat.errors import LongboatError
from longboat.sim.optional import import_simulator
from longboat.utils.plugins import with_plugins
from longboat.utils.registry import Registry

STATE_FEATURE = "observation.state"
IMAGE_PREFIX = "observation.images."
FRAME_INFO = "frame"  # step/reset info of an episode recorded on video: the video camera's frame


class RunnerSetupError(LongboatError, ValueError):
    """The benchmark's environments cannot give what the policy reads (a camera, a state size)."""


@dataclass(frozen=True)
class ObservationSpec:
    """What the policy reads: ``cameras`` dataset camera key -> simulator camera (None: the simulator's default),
    frames ``image_size`` square, the state zero-padded to ``state_dim`` (None: as the simulator gives it);
    ``wire_keys`` wire key -> feature. Videos show ``video_camera`` (None: the simulator's default)."""

    wire_keys: dict[str, str]
    cameras: dict[str, str | None] = field(default_factory=dict)
    image_size: int = 128
    state_dim: int | None = None
    video_camera: str | None = None  # rendered only in the episodes recorded on video
    video_size: int = 128


class Runner(ABC):
    """One benchmark: its tasks, their environments, and the mapping between environments and the policy."""

    name: str
    simulator_modules: tuple[str, ...] = ()  # what an env worker imports before it builds its env
    plugins: tuple[str, ...] = ()  # what an env worker imports first: the eval config's plugins (set by the eval)

    def __init__(self, spec: ObservationSpec):
        self.spec = spec

    @abstractmethod
    def tasks(self) -> list[str]:
        """The task names this benchmark knows."""

    @abstractmethod
    def env_fn(self, task: str, spec: ObservationSpec) -> Callable[[], object]:
        """A picklable factory of one ``gymnasium.Env`` of ``task`` (run in a worker process for async envs)."""

    def sizes(self, task: str) -> tuple[int | None, int | None]:
        """The (state, action) sizes ``task``'s simulator gives and takes, known without building an env; None where
        not (then only the episodes find out)."""
        return None, None

    def renders(self) -> bool:
        """Whether stepping renders images (then async envs, one process each, pay off)."""
        return bool(self.spec.cameras)

    def request(self, obs: dict[str, np.ndarray], prompt: str) -> dict:
        """One env's observation (dataset features, time axis included when the policy stacks frames) as a
        policy request keyed by wire keys."""
        return {wire: obs[feature] for wire, feature in self.spec.wire_keys.items()} | {"prompt": prompt}

    def action(self, row: np.ndarray, space) -> np.ndarray:
        """A row of the action chunk in robot units, fitted to one env's action space (a policy trained on several
        simulators pads actions to the widest one: the env takes its own leading dimensions)."""
        return np.clip(np.asarray(row, dtype=np.float32)[: space.shape[0]], space.low, space.high)

    def make_vector_env(self, task: str, num_envs: int, mode: Literal["sync", "async"]):
        """``num_envs`` envs of ``task``; async envs each run in a process forked from a fork server (see
        ``start_worker_server``). Autoreset is off: the orchestrator resets each env when its episode ends."""
        vector = import_simulator("gymnasium.vector")
        fns = [self.env_fn(task, self.spec) for _ in range(num_envs)]
        if mode == "async":
            if self.plugins:  # what registered this benchmark or its simulator, imported in each worker first
                fns = [partial(with_plugins, list(self.plugins), fn) for fn in fns]
            return vector.AsyncVectorEnv(fns, context=self.start_worker_server(),
                                         autoreset_mode=vector.AutoresetMode.DISABLED)
        return vector.SyncVectorEnv(fns, autoreset_mode=vector.AutoresetMode.DISABLED)

    def start_worker_server(self) -> str:
        """Start the fork server that async env workers are forked from, if it is not running; returns its start
        method. It preloads the main script, this runner's module and its simulator, so a worker starts as a fork of
        a process that has imported them (seconds saved per worker, and per task: the server outlives the vector
        envs) and holds no GL context to break (a fork of this process could). Called ahead of the first vector env,
        it imports while this process gets on with its own start-up. The server starts once per process, with the
        modules of the runner that first asks; its imports only save time (one that fails is skipped there and
        fails again in the worker, where it is reported)."""
        import_simulator("gymnasium.vector")  # sets MUJOCO_GL, which the server inherits
        multiprocessing.get_context("forkserver").set_forkserver_preload(
            ["__main__", "gymnasium.vector", type(self).__module__, *self.simulator_modules])
        multiprocessing.forkserver.ensure_running()
        return "forkserver"


RUNNERS: Registry[Callable[[ObservationSpec], Runner]] = Registry(
    "benchmark", "known", ConfigError, hint="one of your own registers through the eval config's plugins:")


def register_runner(name: str):
    """Class decorator: the runner of benchmark ``name``."""
    def wrap(cls):
        RUNNERS.register(name, cls)
        cls.name = name
        return cls
    return wrap
