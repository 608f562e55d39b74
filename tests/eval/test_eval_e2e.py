"""``longboat eval`` end to end: an MLP policy trained here on recorded Meta-World reach demonstrations (state
only), evaluated in closed loop; the server killed mid-run is restarted and the orchestrator killed mid-run
resumes, both ending with each episode exactly once and the outcomes of an uninterrupted run; with a deterministic
server, two runs write the same episodes."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from longboat.data.robot.encode import video_info
from longboat.eval.config import EvalConfig
from longboat.eval.orchestrator import run_eval
from longboat.eval.results import read_results
from longboat.serving.server_manager import ServerManager
from longboat.sim import record
from tests.conftest import REPO, run_longboat

pytestmark = pytest.mark.slow

SEEDS = [100, 102, 104]
BASE = {"benchmark": "metaworld", "tasks": ["reach-v3"], "seeds": SEEDS, "num_envs": 2, "max_steps": 100,
        "serve": {"threads": 1}, "videos_per_task": 0, "observation": {}}  # the state as the simulator gives it


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval_e2e")
    record(["metaworld:reach-v3"], 20, tmp / "demos", cameras=(), progress=False)
    run_longboat("train", "configs/policy/mlp_tiny.yaml", f"data.path={tmp / 'demos'}", f"run_dir={tmp / 'run'}",
                 "train.steps=300", "train.threads=1", "train.tensorboard=false", check=True)
    return tmp / "run"


@pytest.fixture(scope="module")
def clean_run(policy, tmp_path_factory):
    """An uninterrupted evaluation through a server the orchestrator starts, with a video."""
    out = tmp_path_factory.mktemp("clean")
    cfg = EvalConfig(**{**BASE, "videos_per_task": 1, "video_size": 32}, policy=str(policy), output_dir=str(out))
    summary = run_eval(cfg, progress=False)
    return out, summary, {e["seed"]: (e["success"], e["length"]) for e in read_results(out / "results.jsonl")}


@pytest.fixture(scope="module")
def server(policy, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with ServerManager([str(policy), "--threads", "1"], log, check_every_s=0.2) as manager:
        yield manager


def _outcomes(out):
    episodes = read_results(out / "results.jsonl")
    assert sorted(e["seed"] for e in episodes) == SEEDS, "each episode exactly once"
    return {e["seed"]: (e["success"], e["length"]) for e in episodes}


def _wait_for_lines(path, n, running, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and running():
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path}: fewer than {n} episodes when the run ended or after {timeout} s")


def test_trained_policy_succeeds_in_closed_loop_with_a_report(clean_run):
    out, summary, outcomes = clean_run
    task = summary["tasks"]["reach-v3"]
    # The policy reaches on these held-out seeds within 100 steps (its demonstrations take about 50).
    assert task["successes"] == 3 and task["episodes"] == 3, outcomes
    assert task["ci95"][0] > 0.4 and task["latency_ms"]["p50"] > 0 and summary["overall"]["successes"] == 3
    episodes = read_results(out / "results.jsonl")
    assert sum(e["video"] is not None for e in episodes) == 1  # the quota: one success (and one failure, had any)
    video = next(e["video"] for e in episodes if e["video"])
    assert video_info(out / video)["video.height"] == 32
    assert "3/3" in (out / "report.html").read_text()


def test_server_killed_mid_eval_is_restarted_and_each_episode_runs_once(clean_run, server, tmp_path):
    cfg = EvalConfig(**BASE, policy=f"ws://{server.host}:{server.port}", output_dir=str(tmp_path))
    done = []
    thread = threading.Thread(target=lambda: done.append(run_eval(cfg, progress=False)))
    thread.start()
    _wait_for_lines(tmp_path / "results.jsonl", 1, thread.is_alive)
    os.kill(server.pid, signal.SIGKILL)
    thread.join(300)
    assert done and server.restarts >= 1
    assert _outcomes(tmp_path) == clean_run[2]


def test_a_deterministic_evaluation_run_twice_gives_the_same_episodes(policy, tmp_path):
    """Two envs' requests meet in the server at whatever moments; served one per forward, every episode is the
    same in both runs, apart from its timings."""
    timings = {"latency_ms", "infer_ms", "wall_s", "started", "finished", "duration_s"}
    runs = []
    for name in ("a", "b"):
        cfg = EvalConfig(**{**BASE, "serve": {"threads": 1, "deterministic": True}}, policy=str(policy),
                         output_dir=str(tmp_path / name))
        run_eval(cfg, progress=False)
        episodes = sorted(read_results(tmp_path / name / "results.jsonl"), key=lambda e: e["seed"])
        runs.append([{k: v for k, v in e.items() if k not in timings} for e in episodes])
    assert "deterministic: one request per forward pass" in (tmp_path / "a" / "server.log").read_text()
    assert runs[0] == runs[1] and len(runs[0]) == len(SEEDS)


@pytest.mark.parametrize("stop", ["kill", "ctrl_c"])
def test_orchestrator_stopped_and_rerun_runs_each_episode_once(clean_run, server, tmp_path, stop, ctrl_c):
    """Killed, or stopped with Ctrl-C (which ends between env steps with exit status 130), the rerun resumes."""
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({**BASE, "policy": f"ws://{server.host}:{server.port}",
                                      "output_dir": str(tmp_path / "out")}))
    cmd = [sys.executable, "-m", "longboat", "eval", str(config), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_lines(tmp_path / "out" / "results.jsonl", 1, lambda: proc.poll() is None)
        if stop == "ctrl_c":
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 130, err
            assert "interrupted: " in err and "the same command resumes" in err and "Traceback" not in err
            assert not (tmp_path / "out" / "summary.json").exists()
    finally:
        proc.kill()
        proc.communicate()
    assert len(read_results(tmp_path / "out" / "results.jsonl")) < len(SEEDS)
    rerun = run_longboat("eval", str(config), "--no-progress", check=True)
    assert "success 3/3" in rerun.stdout
    assert _outcomes(tmp_path / "out") == clean_run[2]
