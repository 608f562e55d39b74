"""``backend: ray`` on a local Ray instance: the same episodes and outcomes as the local backend (temporally
ensembled chunks included), the results file written by this process alone (videos included), resume, a crashed
worker's episodes run again, and an episode's error reported with its task and seed; without Ray, a one-line error
before any work."""

import json
import os
import sys

import pytest
import ray

from longboat.config.base import ConfigError
from longboat.eval.config import EvalConfig
from longboat.eval.episodes import EvalError
from longboat.eval.orchestrator import run_eval
from longboat.eval.results import read_results
from longboat.eval.runners import RUNNERS
from longboat.eval.runners.sim import PushTRunner
from tests.serving.conftest import random_server


SEEDS = [0, 1, 2, 3, 4]
STATE = {"observation.state": [5]}  # Push-T's state as the simulator gives it
BASE = {"benchmark": "pusht", "tasks": ["push_t"], "seeds": SEEDS, "num_envs": 2, "max_steps": 12,
        "observation": {}, "videos_per_task": 1, "video_size": 16,
        "ray": {"episodes_per_runner": 2}}  # three batches for two runners on two CPUs


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def server():
    with random_server(policy={"observation": STATE, "action_dim": 2, "horizon": 5}) as (_, port):
        yield f"ws://127.0.0.1:{port}"


def _config(server, out, **fields) -> EvalConfig:
    return EvalConfig(**{**BASE, **fields}, policy=server, output_dir=str(out))


def _outcomes(out) -> dict:
    episodes = read_results(out / "results.jsonl")
    assert sorted(e["seed"] for e in episodes) == SEEDS, "each episode exactly once"
    return {(e["task"], e["seed"]): (e["success"], e["length"], e["reward"]) for e in episodes}


@pytest.fixture(scope="module")
def local_run(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    run_eval(_config(server, out), progress=False)
    return out


def _assert_same(outcomes: dict, expected: dict) -> None:
    assert outcomes.keys() == expected.keys()
    for key, (success, length, reward) in expected.items():
        assert outcomes[key][:2] == (success, length) and outcomes[key][2] == pytest.approx(reward, rel=1e-4), key


@pytest.mark.slow
def test_ray_runs_the_same_episodes_as_local_into_one_results_file(cluster, server, local_run, tmp_path):
    summary = run_eval(_config(server, tmp_path, backend="ray"), progress=False)
    _assert_same(_outcomes(tmp_path), _outcomes(local_run))
    assert summary["tasks"]["push_t"]["episodes"] == len(SEEDS)
    assert summary["this_run_timing"]["vector_steps"] > 0
    # The video of the first seed came back from its runner and was written here.
    [video] = [e["video"] for e in read_results(tmp_path / "results.jsonl") if e["video"]]
    assert video == "videos/push_t/seed0.mp4" and (tmp_path / video).stat().st_size > 0


@pytest.mark.slow
def test_ray_runners_ensemble_the_chunks_as_the_local_backend_does(cluster, server, tmp_path):
    fields = {"temporal_ensemble": 0.1, "videos_per_task": 0}
    run_eval(_config(server, tmp_path / "local", **fields), progress=False)
    summary = run_eval(_config(server, tmp_path / "ray", backend="ray", **fields), progress=False)
    _assert_same(_outcomes(tmp_path / "ray"), _outcomes(tmp_path / "local"))
    assert all(len(e["latency_ms"]) == e["length"] for e in read_results(tmp_path / "ray" / "results.jsonl"))
    assert summary["chunk_schedule"]["temporal_ensemble"] == 0.1


@pytest.mark.slow
def test_ray_resumes_with_only_the_missing_episodes(cluster, server, local_run, tmp_path):
    kept = read_results(local_run / "results.jsonl")[:2]
    for e in kept:
        e["wall_s"] = -1.0  # a rerun of these episodes would write its own wall time (or fail as a duplicate)
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    (tmp_path / "run.json").write_bytes((local_run / "run.json").read_bytes())  # the same evaluation
    summary = run_eval(_config(server, tmp_path, backend="ray", ray={"episodes_per_runner": 3}), progress=False)
    episodes = read_results(tmp_path / "results.jsonl")
    assert episodes[:2] == kept and all(e["wall_s"] >= 0 for e in episodes[2:])
    _assert_same(_outcomes(tmp_path), _outcomes(local_run))
    assert summary["tasks"]["push_t"]["episodes"] == len(SEEDS)


class CrashOnceRunner(PushTRunner):
    """Kills its Ray worker the first time it builds envs (as a crash or a lost node would)."""

    def __init__(self, spec, marker: str):
        super().__init__(spec)
        self.marker = marker

    def make_vector_env(self, task, num_envs, mode):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return super().make_vector_env(task, num_envs, mode)


@pytest.mark.slow
def test_a_crashed_worker_runs_its_episodes_again(cluster, server, local_run, tmp_path, monkeypatch):
    marker = tmp_path / "crashed"
    monkeypatch.setitem(RUNNERS, "pusht_crash_once", lambda spec: CrashOnceRunner(spec, str(marker)))
    module = sys.modules[__name__]
    ray.cloudpickle.register_pickle_by_value(module)  # the workers need not import the tests
    try:
        run_eval(_config(server, tmp_path / "out", benchmark="pusht_crash_once", backend="ray", videos_per_task=0,
                         ray={"episodes_per_runner": len(SEEDS)}), progress=False)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(module)
    assert marker.exists()
    _assert_same(_outcomes(tmp_path / "out"), _outcomes(local_run))


@pytest.mark.slow
def test_an_episode_error_on_a_runner_names_its_task_and_seed(cluster, tmp_path):
    # The sizes fit (checked before the first episode); the key the envs do not send is refused in the episode.
    policy = {"observation": {**STATE, "observation/extra": [2]}, "action_dim": 2}
    with random_server(policy=policy) as (_, port):
        with pytest.raises(EvalError, match=r"push_t seed \d+: .*missing \['observation/extra'\]"):
            run_eval(_config(f"ws://127.0.0.1:{port}", tmp_path, backend="ray", ray={"episodes_per_runner": 5}),
                     progress=False)


def test_backend_ray_without_ray_fails_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ConfigError, match=r"^backend: ray needs Ray.*pip install 'longboat\[ray\]'$"):
        run_eval(_config("ws://127.0.0.1:9", tmp_path / "out", backend="ray"), progress=False)
    assert not (tmp_path / "out").exists()
