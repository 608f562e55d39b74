"""Recordable environments by name, ``<simulator>:<task>``: a simulator registers its task list and a factory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from longboat.data.robot.record.env import SimEnv
from longboat.data.robot.record.errors import RecordError


@dataclass(frozen=True)
class Simulator:
    tasks: Callable[[], list[str]]  # imports the simulator, so listing needs it installed
    make: Callable[[str], SimEnv]


SIMULATORS: dict[str, Simulator] = {}


def register_simulator(prefix: str, tasks: Callable[[], list[str]]):
    """Class or function decorator: ``make(task) -> SimEnv`` for the names ``prefix:<task>``."""
    def wrap(make):
        SIMULATORS[prefix] = Simulator(tasks, make)
        return make
    return wrap


def known_envs() -> list[str]:
    return [f"{prefix}:{task}" for prefix, sim in SIMULATORS.items() for task in sim.tasks()]


def make_env(name: str) -> SimEnv:
    """The environment ``name`` (e.g. ``metaworld:reach-v3``, ``fetch:push``); an unknown one lists the known."""
    prefix, _, task = name.partition(":")
    sim = SIMULATORS.get(prefix)
    if sim is None or not task:
        raise RecordError(f"unknown environment {name!r}: expected <simulator>:<task> with simulator one of "
                          f"{', '.join(SIMULATORS)} (e.g. fetch:push)")
    tasks = sim.tasks()
    if task not in tasks:
        raise RecordError(f"unknown environment {name!r}; known {prefix} tasks: {', '.join(tasks)}")
    return sim.make(task)
