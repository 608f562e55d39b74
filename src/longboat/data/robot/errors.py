"""Errors of the robot-dataset layer: each names the file, key or feature and what was expected."""

from __future__ import annotations

from longboat.errors import LongboatError


class RobotDataError(LongboatError, ValueError):
    """A LeRobot dataset on disk is missing, malformed or does not match what was asked of it."""


class UnknownFeatureError(RobotDataError, KeyError):
    """A requested feature is not in the dataset's ``meta/info.json``."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class VideoDecodeError(RobotDataError):
    """A video file is missing, truncated, or has no frame near a requested timestamp."""
