"""The base of every error a user can act on; the command line prints its message alone, without a traceback.

This module imports nothing of longboat's, so every layer can derive its errors from ``LongboatError``.
"""


class LongboatError(Exception):
    """A problem with the user's input, files or environment, described by a message that says what to fix."""
