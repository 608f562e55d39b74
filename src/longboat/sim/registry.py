"""Recordable environments by name, ``<simulator>:<task>``: a simulator registers its task list and a factory."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from longboat.sim.env import SimEnv
from longboat.sim.errors import SimError
from longboat.utils.registry import Registry, caller_source, source_of


@dataclass(frozen=True)
class Simulator:
    tasks: Callable[[], list[str]]  # imports the simulator, so listing needs it installed
    make: Callable[[str], SimEnv]


SIMULATORS: Registry[Simulator] = Registry("simulator", "known simulators", SimError)


def register_simulator(prefix: str, tasks: Callable[[], list[str]]):
    """Class or function decorator: ``make(task) -> SimEnv`` for the names ``prefix:<task>``."""
    def wrap(make):
        known = SIMULATORS.get(prefix, None)
        if known is None or known.make is not make:  # the very factory again: nothing to do
            SIMULATORS.register(prefix, Simulator(tasks, make), source_of(make) or caller_source(1))
        return make
    return wrap


def known_envs() -> list[str]:
    return [f"{prefix}:{task}" for prefix, sim in SIMULATORS.items() for task in sim.tasks()]


def make_env(name: str) -> SimEnv:
    """The environment ``name`` (e.g. ``metaworld:reach-v3``, ``fetch:push``); an unknown one lists the known."""
    prefix, _, task = name.partition(":")
    sim = SIMULATORS.get(prefix, None)
    if sim is None or not task:
        close = difflib.get_close_matches(prefix, list(SIMULATORS), n=1, cutoff=0.6) if task else []
        hint = f"did you mean '{close[0]}:{task}'? " if close else ""
        raise SimError(f"unknown environment {name!r}: {hint}expected <simulator>:<task> with simulator one of "
                          f"{', '.join(SIMULATORS)} (e.g. fetch:push; one of your own registers through --plugin)")
    tasks = sim.tasks()
    if task not in tasks:
        raise SimError(f"unknown environment {name!r}; known {prefix} tasks: {', '.join(tasks)}")
    return sim.make(task)
