"""An eval config: checked before work, every file under configs/eval loads, and its ``plugins:`` (user code
that registers a benchmark's runner and simulator, imported before the benchmark is resolved)."""

import json
import os
from pathlib import Path

import pytest
import yaml

from longboat.cli.main import main
from longboat.eval.config import EvalConfig, load_eval_config
from tests.serving.conftest import random_server


def _eval(tmp_path, capsys, port: int, **fields) -> tuple[int, str]:
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"benchmark": "point", "tasks": ["reach", "reach_far"], "episodes": 2,
                                      "num_envs": 2, "max_steps": 5, "videos_per_task": 0, "observation": {},
                                      "policy": f"ws://127.0.0.1:{port}", "output_dir": str(tmp_path / "out"),
                                      **fields}))
    code = main(["eval", str(config), "--no-progress"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error: ") == (code != 0), err
    return code, err


def test_a_benchmark_from_a_plugin_evaluates(tmp_path, capsys, point_plugin):
    """The config names the plugin file relative to itself (read back by its absolute path); a random policy runs
    the plugin's tasks in closed loop."""
    with random_server(policy={"observation": {"observation.state": [4]}, "action_dim": 2}) as (server, port):
        code, err = _eval(tmp_path, capsys, port)
        assert code == 2 and ("error: unknown benchmark 'point'; known: fetch, libero_10" in err
                              and err.rstrip().endswith("(one of your own registers through the eval config's "
                                                        "plugins:)")), err
        assert server.stats.requests == 0
        code, err = _eval(tmp_path, capsys, port, plugins=[os.path.relpath(point_plugin, tmp_path)])
        assert code == 0, err
    out = tmp_path / "out"
    episodes = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((e["task"], e["seed"]) for e in episodes) == [("reach", 0), ("reach", 1), ("reach_far", 0),
                                                                 ("reach_far", 1)]
    assert all(0 < e["length"] <= 5 for e in episodes)
    assert load_eval_config(tmp_path / "eval.yaml").plugins == [str(point_plugin)]


def test_a_plugin_that_cannot_be_imported_is_one_line(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("raise RuntimeError('no simulator here')\n")
    for plugins, message in ((["missing.py"], "error: plugin 'missing.py': no such file (looked in"),
                             (["broken.py"], "error: plugin 'broken.py': import failed: RuntimeError: no simulator "
                                             "here (")):
        code, err = _eval(tmp_path, capsys, 1, plugins=plugins)
        assert code == 2 and err.startswith(message), err


def test_async_env_workers_import_the_plugins_too(tmp_path, capsys, point_plugin):
    """Envs that render step in worker processes, which import the config's plugins before they build their env
    (else the plugin's simulator is unknown there)."""
    observation = {"observation.state": [4], "observation.images.top": [16, 16, 3]}
    with random_server(policy={"observation": observation, "action_dim": 2}) as (server, port):
        code, err = _eval(tmp_path, capsys, port, plugins=[str(point_plugin)], tasks=["reach"], vector="async",
                          observation={"cameras": ["top"], "image_size": 16})
        assert code == 0, err
        assert server.stats.requests > 0
    assert len((tmp_path / "out" / "results.jsonl").read_text().splitlines()) == 2


def test_eval_config_is_checked_before_work():
    base = {"benchmark": "metaworld", "tasks": ["reach-v3"], "policy": "ws://h:1", "output_dir": "o"}
    assert EvalConfig(**base, episodes=3, seed=5).episode_seeds() == [5, 6, 7]
    with pytest.raises(ValueError, match="twice"):
        EvalConfig(**{**base, "tasks": ["a", "a"]})
    with pytest.raises(ValueError, match="num_env"):
        EvalConfig(**base, num_env=2)


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "configs" / "eval").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_eval_config_file_loads(path):
    cfg = load_eval_config(path, ["episodes=3"])
    assert cfg.tasks and len(cfg.episode_seeds()) == 3

