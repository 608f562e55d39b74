import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("train_worker.py")


def free_ports(n: int) -> list[int]:
    """Ports free right now (the sockets stay open until all are chosen, so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def torchrun(nproc: int, port: int, *args: str) -> list[str]:
    """A torchrun command line on this machine (gloo on CPU); ``args`` start with a script or ``-m module``."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master-port={port}",
            "--master-addr=127.0.0.1", *args]


def start(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start ``cmd`` in the repository with its output going to ``log`` (no pipe to fill up)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    with open(log, "w") as f:
        # A session of its own, so a timeout can stop torchrun together with its ranks.
        return subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def finish(proc: subprocess.Popen, log: Path, timeout: float) -> str:
    """Wait for ``proc`` (killed after ``timeout`` seconds) and return its output."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"{' '.join(proc.args)} still running after {timeout}s:\n{log.read_text()[-4000:]}")
    return log.read_text()


def assert_bias_balancing_moved(run_dir: Path) -> None:
    """Most steps of a run with DeepSeek-V3's aux-free balancing saw unequal expert loads, so their bias updates
    moved the bias by ±rate per expert (a step whose loads came out exactly equal leaves it). Its final value is no
    witness: with paired loads the bias can toggle back to zero. Equal losses and an equal final bias against one
    process then say it moved identically."""
    from longboat.trainer.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir) if r.get("kind") == "train"]
    moved = sum(r["moe_load_max"] > r["moe_load_min"] for r in rows)
    assert rows and moved >= 0.75 * len(rows), f"{run_dir.name}: the loads differed in {moved} of {len(rows)} steps"
