import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

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


def train_on_two_ranks(cfg: dict, directory: Path, timeout: float = 300) -> Path:
    """``longboat train --nproc 2`` on the run config ``cfg`` (written to ``directory``); its run directory."""
    import yaml

    path, log = directory / "two_ranks.yaml", directory / "two_ranks.log"
    path.write_text(yaml.safe_dump(cfg))
    proc = start([sys.executable, "-m", "longboat", "train", "--nproc", "2", str(path)], log)
    out = finish(proc, log, timeout)
    assert proc.returncode == 0, out[-6000:]
    return Path(cfg["run_dir"])


def assert_bias_balancing_moved(run_dir: Path) -> None:
    """Most steps of a run with DeepSeek-V3's aux-free balancing saw unequal expert loads, so their bias updates
    moved the bias by ±rate per expert (a step whose loads came out exactly equal leaves it). Its final value is no
    witness: with paired loads the bias can toggle back to zero. Equal losses and an equal final bias against one
    process then say it moved identically."""
    from longboat.trainer.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir) if r.get("kind") == "train"]
    moved = sum(r["moe_load_max"] > r["moe_load_min"] for r in rows)
    assert rows and moved >= 0.75 * len(rows), f"{run_dir.name}: the loads differed in {moved} of {len(rows)} steps"


LOG_NAMES = {8: "eight", 4: "four", 2: "two"}  # each launch's output, beside its cases' run directories


@dataclass(frozen=True)
class WorkerRuns:
    """The ``train_worker.py`` cases a test module checks, declared as its ``WORKER_RUNS``.

    The ``worker_runs`` fixture runs the cases of every module in the session in one torchrun launch per world size:
    a rank's start-up (importing torch) costs more CPU than most cases."""

    launches: dict[int, tuple[str, ...]] = field(default_factory=dict)  # world size → cases, run in this order
    beside: tuple[str, ...] = ()  # one-process runs while the launches train (the references)
    after: tuple[str, ...] = ()  # one-process runs that start from a launched case's checkpoint
    stop: str | None = None  # a 2-rank case, run last, that gets SIGTERM (to torchrun) at its slow_from step


def _merge(declared: list[WorkerRuns]) -> WorkerRuns:
    def union(lists) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for names in lists for name in names))

    stops = [w.stop for w in declared if w.stop]
    assert len(stops) <= 1, f"one launch can be stopped, not {stops}"
    sizes = sorted({n for w in declared for n in w.launches}, reverse=True)
    launches = {n: union(w.launches.get(n, ()) for w in declared) for n in sizes}
    if stops:
        launches[2] = (*launches.get(2, ()), stops[0])
    return WorkerRuns(launches, union(w.beside for w in declared), union(w.after for w in declared),
                      stops[0] if stops else None)


def last_step(run_dir: Path) -> int:
    """The last training step in a run's metrics so far (0 before the first)."""
    from longboat.trainer.metrics import read_metrics

    try:
        return max((r["step"] for r in read_metrics(run_dir)), default=0)
    except json.JSONDecodeError:  # a line being written
        return 0


def _stop_when_slow(proc: subprocess.Popen, out: Path, case: str, log: Path) -> None:
    """SIGTERM to torchrun (which passes it on to its ranks) once ``case`` reaches the step from which its data loading
    is slow, so the signal lands mid-run."""
    from tests.distributed.train_worker import CASES

    deadline = time.monotonic() + 900
    while last_step(out / case) < CASES[case].slow_from:
        assert proc.poll() is None, log.read_text()[-6000:]
        assert time.monotonic() < deadline, f"{case} did not reach step {CASES[case].slow_from}"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)


@pytest.fixture(scope="session")
def worker_runs(request, tmp_path_factory) -> Path:
    """The directory holding the runs of every selected module's ``WORKER_RUNS``. The launches run one after another
    (more ranks than cores at once only add switching: all three together took 9% longer), the one-process
    references beside the first; a launched case that resumes a reference's checkpoint waits for it."""
    import torch

    from tests.distributed.train_worker import run_case

    modules = dict.fromkeys(item.module for item in request.session.items if "worker_runs" in item.fixturenames)
    runs = _merge([m.WORKER_RUNS for m in modules if hasattr(m, "WORKER_RUNS")])
    out = tmp_path_factory.mktemp("worker_runs")
    threads = torch.get_num_threads()
    # Compiled cases trace with AOT autograd and run their graphs eagerly: what the layouts change is which parts
    # become graphs, not how inductor lowers them (tests/models/moe/test_moe_checkpoint_compile.py covers that).
    env = {"TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:aot_eager"}
    try:
        for i, (n, cases) in enumerate(runs.launches.items()):
            log = out / f"{LOG_NAMES[n]}.log"
            proc = start(torchrun(n, free_ports(1)[0], str(WORKER), str(out), *cases), log, env=env)
            try:
                if i == 0:
                    for name in runs.beside:
                        run_case(out, name)
                stopped = n == 2 and runs.stop is not None
                if stopped:  # the stopped case runs last, after every other case succeeded
                    _stop_when_slow(proc, out, runs.stop, log)
            except BaseException:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                raise
            text = finish(proc, log, timeout=1200)
            assert proc.returncode == 0 or stopped, f"the {n}-rank launch failed:\n{text[-6000:]}"
    finally:
        torch.set_num_threads(threads)
    for name in runs.after:
        run_case(out, name)
    return out
