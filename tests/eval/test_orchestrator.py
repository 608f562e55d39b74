"""``longboat eval``'s own process: what it starts ends with it, and what it refuses before the first episode."""

import json
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
from tests.serving.conftest import mlp_export


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended; only its entry is left
    except FileNotFoundError:
        return True


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (Linux: read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                continue
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


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
        started = _descendants(proc.pid)
        assert pid in started
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 30
        while not (all(map(_gone, started)) and _port_free(port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in started if not _gone(p)]
        assert not left and _port_free(port), f"processes {left} (the server: {pid}) outlived the eval"
        assert "the process that started this server has ended; stopping" in log.read_text()
    finally:
        proc.kill()
        proc.wait()


def _eval(tmp_path, capsys, policy="ws://127.0.0.1:1", **fields) -> tuple[int, str]:
    """``longboat eval`` in this process on Meta-World reach (state only); returns (exit status, stderr)."""
    from longboat.cli.main import main

    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"benchmark": "metaworld", "tasks": ["reach-v3"], "episodes": 2,
                                      "num_envs": 1, "max_steps": 3, "videos_per_task": 0, "observation": {},
                                      "policy": policy, "output_dir": str(tmp_path / "out"), **fields}))
    code = main(["eval", str(config), "--no-progress"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error: ") == (code != 0), err
    return code, err


@pytest.mark.parametrize("policy, fields, message", [
    ({"action_dim": 2}, {}, "the policy's actions have 2 values, metaworld reach-v3 takes 4"),
    ({"observation": {"observation.state": [8]}}, {}, "the policy reads a state of 8 values, metaworld reach-v3 "
                                                      "gives 39"),
    ({"observation": {"observation.state": [8]}}, {"observation": {"state_dim": 8}}, "the policy reads a state "
                                                                                   "of 8 values, metaworld"),
    ({"observation": {"observation.state": [42]}}, {}, "set observation.state_dim: 42 to zero-pad it"),
])
def test_policy_sizes_that_do_not_fit_the_benchmark_end_before_the_first_episode(tmp_path, capsys, policy, fields,
                                                                                 message):
    from tests.serving.conftest import random_server

    with random_server(policy={"observation": {"observation.state": [39]}, "action_dim": 4, **policy}) as (s, port):
        code, err = _eval(tmp_path, capsys, f"ws://127.0.0.1:{port}", **fields)
        assert code == 2 and message in err
        assert s.stats.requests == 0
    assert not (tmp_path / "out" / "results.jsonl").read_text()


def test_a_policy_that_fits_runs(tmp_path, capsys):
    from tests.serving.conftest import random_server

    with random_server(policy={"observation": {"observation.state": [39]}, "action_dim": 4}) as (_, port):
        assert _eval(tmp_path, capsys, f"ws://127.0.0.1:{port}")[0] == 0
    out = tmp_path / "out"
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "run.json").read_text())["policy"] == f"ws://127.0.0.1:{port}"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # written beside, then renamed


@pytest.mark.parametrize("fields, message", [
    ({"output_dir": "FILE"}, "is a file; expected a directory"),
    ({"output_dir": "FILE/out"}, "a parent of it is a file, not a directory"),
    ({"seeds": [3, -1]}, "'seeds.1': Input should be greater than or equal to 0"),
    ({"seed": -1}, "'seed': Input should be greater than or equal to 0"),
    ({"request_timeout_s": 0}, "'request_timeout_s': Input should be greater than 0"),
])
def test_bad_eval_settings_are_one_line(tmp_path, capsys, fields, message):
    (tmp_path / "file").write_text("notes\n")
    fields = {k: v.replace("FILE", str(tmp_path / "file")) if isinstance(v, str) else v for k, v in fields.items()}
    code, err = _eval(tmp_path, capsys, **fields)
    assert code == 2 and message in err
    assert (tmp_path / "file").read_text() == "notes\n"


def _episode_line(seed: int) -> str:
    return json.dumps({"task": "reach-v3", "seed": seed, "success": True, "reward": 1.0, "length": 3,
                       "failure": None, "latency_ms": [1.0], "infer_ms": [1.0], "wall_s": 0.1, "video": None}) + "\n"


def _identity(tmp_path) -> str:
    from longboat.eval.config import EvalConfig

    return json.dumps(EvalConfig(benchmark="metaworld", tasks=["reach-v3"], episodes=2, max_steps=3, observation={},
                                 policy="ws://127.0.0.1:1", output_dir=str(tmp_path / "out")).identity())


@pytest.mark.parametrize("run, results, message", [
    (None, _episode_line(0), "results.jsonl: holds episodes but"),  # run.json deleted
    ("", _episode_line(0), "run.json: not a run file"),  # empty, as a crash mid-write used to leave it
    ("[1]", "", "run.json: not a run file (expected an object"),
    ("IDENTITY", _episode_line(0) + "[1, 2]\n", "results.jsonl:2: not an episode (expected an object"),
    ("IDENTITY", '{"task": "reach-v3", "seed": "0"}\n', "results.jsonl:1: not an episode ('seed': expected int"),
])
def test_a_resume_needs_a_run_file_and_episodes_it_can_read(tmp_path, capsys, run, results, message):
    out = tmp_path / "out"
    out.mkdir()
    if run is not None:
        (out / "run.json").write_text(_identity(tmp_path) if run == "IDENTITY" else run)
    (out / "results.jsonl").write_text(results)
    code, err = _eval(tmp_path, capsys)
    assert code == 2 and message in err
    if run is None or run == "":
        assert "to start over" in err
    assert (out / "results.jsonl").read_text() == results  # nothing the user had is lost


def test_every_episode_is_filmed_until_failures_and_successes_have_their_videos():
    from longboat.eval.orchestrator import VideoQuota

    quota = VideoQuota(2, [1, 2, 3, 4, 5, 6], done=[])
    assert sorted(quota) == [1, 2, 3, 4, 5, 6] and 3 in quota
    assert [quota.keep(True), quota.keep(True), quota.keep(True)] == [True, True, False]
    assert 4 in quota  # still looking for failures
    assert [quota.keep(False), quota.keep(False)] == [True, True]
    assert list(quota) == [] and 5 not in quota and not quota.keep(False)
    resumed = VideoQuota(1, [1, 2, 3], done=[{"success": True, "video": "a.mp4"}, {"success": False, "video": None}])
    assert not resumed.keep(True) and 2 in resumed and resumed.keep(False) and list(resumed) == []
    assert list(VideoQuota(0, [1, 2], done=[])) == []
