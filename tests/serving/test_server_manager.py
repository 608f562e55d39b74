"""``ServerManager`` runs the real ``longboat serve`` command, restarts it when killed, and the client carries on."""

import os
import signal
import time

import numpy as np
import pytest

from longboat.serving.client import PolicyClient
from longboat.serving.server_manager import ServerManager, ServerStartError
from tests.serving.conftest import small_obs

SPEC = '{"observation": {"observation/image": [32, 32, 3], "observation/state": [8]}}'


@pytest.mark.slow
def test_manager_restarts_a_killed_server_and_the_client_carries_on(tmp_path):
    log = tmp_path / "serve.log"
    with ServerManager(["--random-policy", SPEC], log, check_every_s=0.2) as manager:
        client = PolicyClient(port=manager.port, connect_timeout_s=120)
        before = client.infer(small_obs(), seed=5)
        first = manager.pid
        os.kill(first, signal.SIGKILL)
        after = client.infer(small_obs(), seed=5)  # waits through the restart
        assert manager.restarts == 1 and manager.pid != first
        np.testing.assert_array_equal(before["actions"], after["actions"])
        assert client.reconnects == 1
        pid = manager.pid
    with pytest.raises(ProcessLookupError):  # stopped: SIGTERM to its process group
        os.kill(pid, 0)
    assert "serving on ws://127.0.0.1" in log.read_text()
    # SIGTERM ends it cleanly, its stdin watcher still waiting (reading a locked buffered stdin aborted the exit).
    assert "stopped after" in log.read_text() and "Fatal Python error" not in log.read_text()
    assert "websockets" not in log.read_text()  # connections and health checks are not logged unless --verbose
    assert log.read_text().count("[manager]") == 2


@pytest.mark.slow
def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path):
    log = tmp_path / "serve.log"
    manager = ServerManager(["/nonexistent/export"], log)
    start = time.monotonic()
    with pytest.raises(ServerStartError, match=r"exited with status 2 before it answered \(/nonexistent/export: not a "
                                               r"policy export"):  # the server's own error line
        manager.start()
    assert time.monotonic() - start < 60
    assert "no such export" in log.read_text() or "not a policy export" in log.read_text()
    manager.stop()


def test_a_host_that_does_not_resolve_is_refused_before_a_server_starts(tmp_path):
    from longboat.config.base import ConfigError

    with pytest.raises(ConfigError, match="--host no.such.host.invalid: cannot resolve"):
        ServerManager(["--random-policy", SPEC], tmp_path / "serve.log", host="no.such.host.invalid")
    assert not (tmp_path / "serve.log").exists()


@pytest.mark.slow
def test_serve_stops_gracefully_when_its_stdin_ends(tmp_path):
    """What ends a managed server when its manager's process dies: the pipe to its stdin closes."""
    import subprocess
    import sys

    from longboat.serving.server_manager import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "longboat", "serve", "--random-policy", SPEC, "--port", str(port),
                             "--exit-with-stdin"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client = PolicyClient(port=port, connect_timeout_s=120)  # waits for the server to come up
        assert client.infer(small_obs())["actions"].shape == (10, 7)
        proc.stdin.close()
        proc.wait(30)
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert "the process that started this server has ended; stopping" in err and "stopped after 1 requests" in err
