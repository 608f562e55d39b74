"""``longboat train --nproc N``: torchrun's launcher, run inside this process so that the job's output is the ranks'.

Run as its own program, torchrun follows a rank's one-line ``error:`` with its ``ChildFailedError`` traceback and a
failure table. Here its loggers are quiet, a failed job ends with the exit status of the rank that failed first, and
its signal handling is torchrun's own: SIGTERM or SIGINT to this process is passed on to every rank (which stop with
a checkpoint) and the job exits 128 + the signal's number.
"""

from __future__ import annotations

import logging
import os

# The launcher's modules; each logs through a logger of its own under these, at the level $LOGLEVEL sets.
_LAUNCHER_LOGGERS = ("torch.distributed.run", "torch.distributed.launcher", "torch.distributed.elastic")


def launch_local(nproc: int, torchrun_args: list[str]) -> int:
    """Run torchrun with ``--standalone --nproc_per_node=nproc`` and ``torchrun_args`` (its options, then the
    program); return the job's exit status."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(["--standalone", f"--nproc_per_node={nproc}", *torchrun_args])
    _quiet_launcher()
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        _, failure = e.get_first_failure()  # the root cause: the others were stopped because of it
        return exit_status(failure.exitcode)
    except SignalException as e:  # the ranks have been sent the signal and have stopped
        return 128 + int(e.sigval)
    return 0


def exit_status(exitcode: int) -> int:
    """A process's exit code as a shell reports it: a death by signal N (negative N from subprocess) is 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode


def _quiet_launcher() -> None:
    """Silence the launcher's own log lines (start-up notes, worker failures, the failure table): the ranks report.
    With $LOGLEVEL set (torchrun's own switch) they are left as torchrun would print them."""
    if os.environ.get("LOGLEVEL"):
        return
    for name in _LAUNCHER_LOGGERS:
        # Their modules' loggers are children, some created only once the launch imports them: stop their records
        # here (a handler, so that logging's last-resort handler does not print them either).
        logger = logging.getLogger(name)
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
