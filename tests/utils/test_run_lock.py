"""One run per directory: a live holder's lock refuses a second one, naming its pid and host; a dead holder's
lock is released by the kernel."""

import sys

import pytest

from longboat.utils.run_lock import RunDirLock, RunDirLockedError

pytestmark = pytest.mark.slow


def test_one_run_per_directory(tmp_path):
    import subprocess

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from longboat.utils.run_lock import "
                               "RunDirLock; RunDirLock(sys.argv[1]).acquire(); print('held', flush=True); "
                               "time.sleep(60)", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(RunDirLockedError, match=rf"is in use by pid {holder.pid} on host"):
        RunDirLock(tmp_path).acquire()
    holder.kill()
    holder.wait()
    with RunDirLock(tmp_path):  # a dead holder's lock is released by the kernel
        pass
