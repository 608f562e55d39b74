"""Errors of recording: an unknown simulator or task, a simulator that is not installed, frames that cannot be
rendered."""

from __future__ import annotations

from longboat.errors import LongboatError, WorldError


class RecordError(LongboatError, ValueError):
    """A recording request names an unknown environment or camera, or its simulator is missing."""


class RenderError(WorldError):
    """A renderer cannot make frames of the size asked here: beyond its framebuffer limit, or memory short."""
