"""``longboat eval``'s own process: what it starts ends with it, and what it refuses before the first episode."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import REPO
from tests.eval.conftest import mlp_export


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended; only its entry is left
    except FileNotFoundError:
        return True


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: connections in TIME_WAIT pass
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@pytest.mark.slow
def test_sigkill_of_eval_ends_the_server_it_started(tmp_path):
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({
        "benchmark": "metaworld", "tasks": ["reach-v3"], "episodes": 50, "num_envs": 1, "videos_per_task": 0,
        "observation": {}, "serve": {"threads": 1}, "policy": str(mlp_export(tmp_path / "export")),
        "output_dir": str(tmp_path / "out")}))
    proc = subprocess.Popen([sys.executable, "-m", "longboat", "eval", str(config), "--no-progress"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "out" / "server.log"
    try:
        deadline, up = time.monotonic() + 180, None
        while up is None and time.monotonic() < deadline and proc.poll() is None:
            up = re.search(r"serving on ws://127\.0\.0\.1:(\d+) \(pid (\d+)", log.read_text() if log.exists() else "")
            time.sleep(0.1)
        assert up, f"the server did not come up; {log.read_text() if log.exists() else 'no log'}"
        port, pid = int(up[1]), int(up[2])
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 30
        while not (_gone(pid) and _port_free(port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid) and _port_free(port), f"the server (pid {pid}) outlived the eval that started it"
        assert "the process that started this server has ended; stopping" in log.read_text()
    finally:
        proc.kill()
        proc.wait()
