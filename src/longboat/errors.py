"""The base of every error a user can act on; the command line prints its message alone, without a traceback.

Two kinds, told apart by the exit status: bad input (a config, an argument, a file's content: exit 2) and a
failure of the world the command runs in (a port in use, a disk full, memory that cannot be had: exit 1).
This module imports nothing of longboat's, so every layer can derive its errors from these.
"""


class LongboatError(Exception):
    """A problem with the user's input, files or environment, described by a message that says what to fix."""

    exit_code = 2  # bad input


class WorldError(LongboatError):
    """The input is fine but the machine cannot do it now: a port taken, a path unwritable, memory short."""

    exit_code = 1


class StoppedByPeer(LongboatError):
    """This rank stopped because another rank of the job failed first; that rank's error is the one to read, so the
    command line prints nothing for this one."""

    quiet = True
