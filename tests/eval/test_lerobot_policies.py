"""``longboat eval`` with ``policy:`` a LeRobot policy directory (ACT with temporal ensembling, Diffusion Policy,
SmolVLA), in closed loop on the point simulator of ``tests/plugins/point_sim.py``: the episodes run, the chunk
schedule is the policy's own, and every action the envs took is what the policy, opened in this process, answers
for the same observations and seeds.

The directories are LeRobot's own fixtures (``tests/fixtures/lerobot_policies``, saved by LeRobot 0.4.4) with one
edit: the camera's frames are square (48x48 for 48x64), as the point simulator renders them. No tensor depends on
the frame's width: ACT's image positions are computed from the feature map, the diffusion ResNet's 2x2 feature map
(and so its spatial-softmax grid) is the same for both, and SmolVLA resizes with padding to 32x32. The weights are
the fixtures' own (rebuilt from their ``weights.json``). The policies' 3 action values drive the point's 2 (an env
takes its own leading dimensions); the camera is mapped to the simulator's with ``observation.wire_keys``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from longboat.cli.main import main
from longboat.eval.results import read_results
from longboat.recipes.artifact import open_artifact
from longboat.serving.policy_bundle import open_policy
from longboat.serving.served_export import served_export
from tests.models.policy.lerobot.conftest import FIXTURES
from lerobot_policy_weights import write_weights  # noqa: E402  (on the path the conftest above sets)

CAMERA, SIZE, MAX_STEPS, SEEDS = "observation.images.cam", 48, 6, [3, 7]
REQUEST_SEED_STRIDE = 1_000_003  # the eval's request seed: episode seed * stride + step


def square_frames(name: str, out: Path) -> Path:
    """LeRobot fixture ``name`` with its camera's frames [3, 48, 48] in config.json and its normaliser's features."""
    target = out / name
    shutil.copytree(FIXTURES / "lerobot_policies" / name, target)

    def edit(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == CAMERA and isinstance(value, dict) and "shape" in value:
                    assert value["shape"] == [3, 48, 64]
                    value["shape"] = [3, SIZE, SIZE]
                else:
                    edit(value)
        elif isinstance(node, list):
            for value in node:
                edit(value)

    for file in ("config.json", "policy_preprocessor.json"):
        data = json.loads((target / file).read_text())
        edit(data)
        (target / file).write_text(json.dumps(data, indent=4))
    write_weights(target)
    return target


def run_eval_cli(tmp_path: Path, plugin: Path, policy: Path, capsys) -> Path:
    """``longboat eval`` (the CLI, in this process) of two episodes on two envs stepping together in this process."""
    out = tmp_path / "eval"
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({
        "plugins": [str(plugin)], "benchmark": "point", "tasks": ["reach"], "seeds": SEEDS, "num_envs": 2,
        "vector": "sync", "max_steps": MAX_STEPS, "videos_per_task": 0, "policy": str(policy),
        "serve": {"deterministic": True, "threads": 1},
        "observation": {"cameras": ["top"], "image_size": SIZE,
                        "wire_keys": {CAMERA: "observation.images.top", "observation.state": "observation.state"}},
        "output_dir": str(out)}))
    code = main(["eval", str(config), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    return out


@pytest.fixture
def one_thread():
    """The policy in this process on one thread, as the eval's server runs it (``serve.threads``): torch's threads
    fighting over a busy machine's cores make each forward pass tens of times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def env_actions(point_plugin, monkeypatch):
    """Every action the point simulator's envs take, per episode seed (the envs step in this process)."""
    from longboat.sim import make_env
    from longboat.utils.plugins import load_plugins

    load_plugins([str(point_plugin)])
    cls = type(make_env("point:reach"))
    taken: dict[int, list[np.ndarray]] = {}
    reset, step = cls.reset, cls.step

    def recording_reset(self, seed):
        self._recorded = taken.setdefault(int(seed), [])
        self._recorded.clear()
        return reset(self, seed)

    def recording_step(self, action):
        self._recorded.append(np.array(action, np.float32))
        return step(self, action)

    monkeypatch.setattr(cls, "reset", recording_reset)
    monkeypatch.setattr(cls, "step", recording_step)
    return taken


def replay(served, seed: int, length: int, replan: int, ensemble: float | None, n_obs: int) -> np.ndarray:
    """The actions of an episode of ``length`` steps, ``served`` (the policy opened in this process as the server
    opens it) asked with the eval's request seeds; chunks used as LeRobot's own code uses them: ``replan`` rows of
    each, or the temporal ensemble of every chunk covering the step (weights exp(-ensemble * i), i = 0 the oldest)."""
    from longboat.sim import make_env

    sim = make_env("point:reach")
    state, frames, chunks, actions = sim.reset(seed), [], [], []
    for t in range(length):
        frame = (state, sim.render("top", SIZE))
        frames = frames[1:] + [frame] if frames else [frame] * n_obs  # the first repeated before the start
        if n_obs == 1:
            obs = {CAMERA: frames[0][1], "observation.state": frames[0][0]}
        else:
            obs = {CAMERA: np.stack([f[1] for f in frames]), "observation.state": np.stack([f[0] for f in frames])}
        if ensemble is not None or t % replan == 0:
            request = {**obs, "prompt": sim.task}
            chunks.append((t, np.asarray(served.infer([request], [seed * REQUEST_SEED_STRIDE + t])[0]["actions"])))
        if ensemble is None:
            start, chunk = chunks[-1]
            action = chunk[t - start]
        else:
            rows = np.array([c[t - s] for s, c in chunks if t - s < len(c)], np.float64)
            weights = np.exp(-ensemble * np.arange(len(rows)))
            action = (weights[:, None] * rows).sum(0) / weights.sum()
        action = np.clip(np.asarray(action, np.float32)[:2], -1, 1)
        actions.append(action)
        state = sim.step(action)[0]
    return np.stack(actions)


CASES = {  # fixture: (the schedule summary.json records, replan, ensemble, n_obs_steps)
    "act_prenorm": ({"replan_steps": 1, "temporal_ensemble": 0.01, "set_by": {
        "replan_steps": "temporal_ensemble", "temporal_ensemble": "policy metadata"}}, 1, 0.01, 1),
    "diffusion": ({"replan_steps": 4, "temporal_ensemble": None, "set_by": {"replan_steps": "policy metadata"}},
                  4, None, 2),
    "smolvla": ({"replan_steps": 4, "temporal_ensemble": None, "set_by": {"replan_steps": "policy metadata"}},
                4, None, 1),
}


@pytest.mark.slow  # a policy server starts in a child process (about 10 s)
@pytest.mark.parametrize("name", list(CASES))
def test_eval_runs_a_lerobot_policy_directory_in_closed_loop(name, tmp_path, capsys, point_plugin, env_actions,
                                                           one_thread):
    schedule, replan, ensemble, n_obs = CASES[name]
    policy = square_frames(name, tmp_path)
    out = run_eval_cli(tmp_path, point_plugin, policy, capsys)
    episodes = sorted(read_results(out / "results.jsonl"), key=lambda e: e["seed"])
    assert [e["seed"] for e in episodes] == SEEDS
    summary = json.loads((out / "summary.json").read_text())
    assert summary["chunk_schedule"] == schedule and summary["overall"]["episodes"] == len(SEEDS)
    report = (out / "report.html").read_text()
    assert ("temporal ensemble (coefficient 0.01)" in report) == (ensemble is not None)
    served = served_export(open_policy(open_artifact(policy)))
    for episode in episodes:
        length = episode["length"]
        assert 0 < length <= MAX_STEPS and episode["failure"] in (None, "time_limit")
        assert len(episode["latency_ms"]) == -(-length // replan), "asked every step (ensembling), or every replan"
        taken = np.stack(env_actions[episode["seed"]])
        assert taken.shape == (length, 2)
        expected = replay(served, episode["seed"], length, replan, ensemble, n_obs)
        np.testing.assert_allclose(taken, expected, rtol=0, atol=1e-5)
    assert "Fatal Python error" not in (out / "server.log").read_text()
