"""Envs in processes of their own each run a lane (their own loop and client, drawing episodes from one queue): the
same episodes and outcomes as envs stepping together, videos included, and a lane's error ends the run at once
with its task and seed. Each episode follows the run's chunk schedule: the config's, else the policy's own
(temporal ensembling asks every step)."""

import json
from contextlib import contextmanager

import pytest
import yaml

from longboat.cli.main import main
from longboat.eval.config import EvalConfig
from longboat.eval.episodes import EvalError
from longboat.eval.orchestrator import run_eval
from longboat.eval.results import read_results
from longboat.serving.random_policy import RandomPolicy, RandomPolicyConfig
from longboat.serving.server import PolicyServer, ServerConfig, serving_in_thread
from tests.serving.conftest import random_server

SEEDS = [0, 1, 2, 3, 4]  # five episodes on two lanes: one lane runs three, in whichever order they come free
BASE = {"benchmark": "pusht", "tasks": ["push_t"], "seeds": SEEDS, "num_envs": 2, "max_steps": 12,
        "observation": {}, "videos_per_task": 2, "video_size": 16}


@pytest.fixture(scope="module")
def server():
    with random_server(policy={"observation": {"observation.state": [5]}, "action_dim": 2, "horizon": 5}) as (_, port):
        yield f"ws://127.0.0.1:{port}"


def _run(server, out, **fields) -> list[dict]:
    run_eval(EvalConfig(**{**BASE, **fields}, policy=server, output_dir=str(out)), progress=False)
    return sorted(read_results(out / "results.jsonl"), key=lambda e: e["seed"])


@pytest.mark.slow
def test_async_lanes_run_the_same_episodes_as_envs_stepping_together(server, tmp_path):
    together = _run(server, tmp_path / "sync", vector="sync")
    lanes = _run(server, tmp_path / "async", vector="async")
    assert [e["seed"] for e in lanes] == SEEDS, "each episode exactly once"
    for a, b in zip(lanes, together):
        assert (a["success"], a["length"], len(a["latency_ms"])) == (b["success"], b["length"], len(b["latency_ms"]))
        assert a["reward"] == pytest.approx(b["reward"], rel=1e-4)
    videos = [e["video"] for e in lanes if e["video"]]
    assert videos == ["videos/push_t/seed0.mp4", "videos/push_t/seed1.mp4"]
    assert all((tmp_path / "async" / v).stat().st_size > 0 for v in videos)


@pytest.mark.slow
def test_a_lane_error_ends_the_run_with_its_task_and_seed(tmp_path):
    # The sizes fit (checked before the first episode); the key the envs do not send is refused in the episode.
    policy = {"observation": {"observation.state": [5], "observation/extra": [2]}, "action_dim": 2}
    with random_server(policy=policy) as (_, port):
        with pytest.raises(EvalError, match=r"push_t seed \d+: .*missing \['observation/extra'\]"):
            _run(f"ws://127.0.0.1:{port}", tmp_path, vector="async")


@contextmanager
def _point_server(**metadata):
    """A random policy for the point simulator whose metadata carries ``metadata`` (LeRobot's chunk settings)."""
    policy = RandomPolicy(RandomPolicyConfig(observation={"observation.state": [4]}, action_dim=2, horizon=6))
    policy.metadata.update(metadata)
    server = PolicyServer(policy, ServerConfig(port=0))
    with serving_in_thread(server) as port:
        yield server, port


def _eval_point(tmp_path, capsys, plugin, port: int, out: str, **fields) -> tuple[int, str]:
    """``longboat eval`` (the CLI, in this process) of 2 episodes of 4 steps on the point simulator."""
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"plugins": [str(plugin)], "benchmark": "point", "tasks": ["reach"],
                                      "episodes": 2, "num_envs": 2, "max_steps": 4, "videos_per_task": 0,
                                      "observation": {}, "policy": f"ws://127.0.0.1:{port}",
                                      "output_dir": str(tmp_path / out), **fields}))
    code = main(["eval", str(config), "--no-progress"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error: ") == (code != 0), err
    return code, err


def _asks(out) -> list[tuple[int, int]]:
    """(episode length, chunks it asked for) per episode."""
    return [(e["length"], len(e["latency_ms"])) for e in read_results(out / "results.jsonl")]


def test_temporal_ensembling_asks_every_step_and_the_policys_own_settings_decide_by_default(tmp_path, capsys,
                                                                                           point_plugin):
    with _point_server(temporal_ensemble_coeff=0.01, n_action_steps=1) as (server, port):
        assert _eval_point(tmp_path, capsys, point_plugin, port, "meta")[0] == 0
        asks = _asks(tmp_path / "meta")
        assert asks and all(n == length for length, n in asks) and server.stats.requests == sum(n for _, n in asks)
        summary = json.loads((tmp_path / "meta" / "summary.json").read_text())
        assert summary["chunk_schedule"] == {"replan_steps": 1, "temporal_ensemble": 0.01, "set_by": {
            "replan_steps": "temporal_ensemble", "temporal_ensemble": "policy metadata"}}
        assert "temporal ensemble (coefficient 0.01)" in (tmp_path / "meta" / "report.html").read_text()
        # Turned off by the config: the policy's n_action_steps (1) is left, so set replan_steps too.
        assert _eval_point(tmp_path, capsys, point_plugin, port, "off", temporal_ensemble=False,
                           replan_steps=3)[0] == 0
        assert all(n == -(-length // 3) for length, n in _asks(tmp_path / "off"))
        assert json.loads((tmp_path / "off" / "summary.json").read_text())["chunk_schedule"] == {
            "replan_steps": 3, "temporal_ensemble": None, "set_by": {"replan_steps": "config",
                                                                     "temporal_ensemble": "config"}}
        code, err = _eval_point(tmp_path, capsys, point_plugin, port, "clash", replan_steps=3)
        assert code == 2 and "replan_steps: 3, but the policy ensembles its chunks" in err
        assert "set temporal_ensemble: false" in err
    with _point_server(temporal_ensemble_coeff="0.01") as (server, port):  # metadata the eval cannot read
        code, err = _eval_point(tmp_path, capsys, point_plugin, port, "unreadable")
        assert code != 0 and "temporal_ensemble_coeff '0.01' is not a finite number" in err
        assert server.stats.requests == 0
    with _point_server() as (server, port):  # a policy without settings of its own: the config's coefficient
        assert _eval_point(tmp_path, capsys, point_plugin, port, "config", temporal_ensemble=0.5)[0] == 0
        asks = _asks(tmp_path / "config")
        assert asks and all(n == length for length, n in asks)
        assert json.loads((tmp_path / "config" / "summary.json").read_text())["chunk_schedule"][
            "temporal_ensemble"] == 0.5
        assert _eval_point(tmp_path, capsys, point_plugin, port, "whole")[0] == 0  # no settings: whole chunks
        assert all(n == -(-length // 6) for length, n in _asks(tmp_path / "whole"))


@pytest.mark.parametrize("fields, message", [
    ({"temporal_ensemble": 0.01, "replan_steps": 4}, "temporal_ensemble asks the policy every step: replan_steps "
                                                     "must be 1 or null, got 4"),
    ({"temporal_ensemble": float("nan")}, "'temporal_ensemble': Value error, expected a finite coefficient, got nan"),
    ({"temporal_ensemble": True}, "expected a coefficient, false (off) or null (the policy's own), got true"),
])
def test_bad_temporal_ensemble_settings_are_one_line(tmp_path, capsys, point_plugin, fields, message):
    code, err = _eval_point(tmp_path, capsys, point_plugin, 1, "out", **fields)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
