"""Benchmark runners by name; ``make_runner`` lists the known ones for an unknown name."""

from longboat.eval.runners import libero, sim  # noqa: F401  (register the LIBERO suites, metaworld, fetch, pusht)
from longboat.eval.runners.base import RUNNERS, ObservationSpec, Runner, register_runner


def make_runner(name: str, spec: ObservationSpec) -> Runner:
    """The runner of benchmark ``name``; an unknown one lists the known (and a close match)."""
    return RUNNERS.get(name)(spec)


__all__ = ["ObservationSpec", "RUNNERS", "Runner", "make_runner", "register_runner"]
