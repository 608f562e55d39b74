"""The simulators are an optional extra (``pip install 'longboat[sim]'``): imported on first use, headless."""

from __future__ import annotations

import importlib
import os

from longboat.sim.errors import SimError


def import_simulator(package: str):
    """Import a simulator package, or say which extra installs it. MuJoCo renders headless (EGL) unless the user's
    own ``MUJOCO_GL`` says otherwise; it is read when mujoco is first imported, so it is set before any import."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == package.split(".")[0]:
            raise SimError(f"the simulator package '{package}' is not installed: "
                              "pip install 'longboat[sim]'") from None
        raise
