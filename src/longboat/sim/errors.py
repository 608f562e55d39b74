"""Errors of the simulators: an unknown simulator or task, a simulator that is not installed, frames that cannot be
rendered."""

from __future__ import annotations

from longboat.errors import LongboatError, WorldError


class SimError(LongboatError, ValueError):
    """A request names an unknown simulator or task, or the simulator's package is not installed."""


class RenderError(WorldError):
    """A renderer cannot make frames of the size asked here: beyond its framebuffer limit, or memory short."""
