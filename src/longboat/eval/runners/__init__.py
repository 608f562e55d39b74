"""Benchmark runners by name; ``make_runner`` lists the known ones for an unknown name."""

from longboat.eval.runners import libero, sim  # noqa: F401  (register the LIBERO suites, metaworld, fetch, pusht)
from longboat.eval.runners.base import RUNNERS, ObservationSpec, Runner, register_runner


def make_runner(name: str, spec: ObservationSpec) -> Runner:
    from longboat.config.base import ConfigError

    if name not in RUNNERS:
        raise ConfigError(f"unknown benchmark {name!r}; known: {', '.join(sorted(RUNNERS))}")
    return RUNNERS[name](spec)


__all__ = ["ObservationSpec", "RUNNERS", "Runner", "make_runner", "register_runner"]
