"""The checkpoint layer's error, in a module of its own so that every checkpoint module can raise it."""

from longboat.errors import LongboatError


class CheckpointError(LongboatError, RuntimeError):
    """A checkpoint is missing, incomplete, damaged, unsafe to read or does not match the run."""
