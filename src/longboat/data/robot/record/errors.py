"""Errors of recording: an unknown simulator or task, or a simulator that is not installed."""

from __future__ import annotations

from longboat.errors import LongboatError


class RecordError(LongboatError, ValueError):
    """A recording request names an unknown environment or camera, or its simulator is missing."""
