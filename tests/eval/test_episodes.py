"""Envs in processes of their own each run a lane (their own loop and client, drawing episodes from one queue): the
same episodes and outcomes as envs stepping together, videos included, and a lane's error ends the run at once
with its task and seed."""

import pytest

from longboat.eval.config import EvalConfig
from longboat.eval.episodes import EvalError
from longboat.eval.orchestrator import run_eval
from longboat.eval.results import read_results
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
