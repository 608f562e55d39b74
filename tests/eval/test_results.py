"""Results file, summary statistics, comparison and report: the parts of an evaluation that need no simulator."""

import json
from pathlib import Path

import pytest

from longboat.config.base import ConfigError
from longboat.eval.compare import compare, format_comparison
from longboat.eval.config import EvalConfig, load_eval_config
from longboat.eval.report import write_report
from longboat.eval.results import RESULTS_FILE, ResultsFile, read_results, summarize
from longboat.utils.stats import wilson_interval as wilson


def _episode(task, seed, success, latency=(10.0,)):
    return {"task": task, "seed": seed, "success": success, "reward": 1.0 * success, "length": 10 + seed,
            "failure": None if success else "time_limit", "latency_ms": list(latency), "infer_ms": [1.0],
            "wall_s": 0.1, "video": None}


def test_wilson_interval_matches_the_formula_values():
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    low, high = wilson(10, 10)
    assert low == pytest.approx(0.7225, abs=1e-4) and high == 1.0
    low, high = wilson(0, 50)
    assert low == 0.0 and high == pytest.approx(0.0713, abs=1e-4)


def test_results_file_cuts_a_torn_line_and_refuses_duplicates(tmp_path):
    path = tmp_path / RESULTS_FILE
    results = ResultsFile(path)
    results.append(_episode("a", 0, True))
    results.append(_episode("a", 1, False))
    with pytest.raises(RuntimeError, match="already"):
        results.append(_episode("a", 1, True))
    results.close()
    with open(path, "a") as f:
        f.write('{"task": "a", "seed": 2, "succ')  # killed mid-write
    resumed = ResultsFile(path)
    assert resumed.done == {("a", 0), ("a", 1)}
    resumed.append(_episode("a", 2, True))
    resumed.close()
    assert [e["seed"] for e in read_results(path)] == [0, 1, 2]
    path.write_text("not json\n")
    with pytest.raises(ConfigError, match=":1: not a JSON line"):
        ResultsFile(path)


def test_summary_per_task_and_overall():
    episodes = [_episode("a", s, s < 3, latency=(float(s), 100.0)) for s in range(4)] + [_episode("b", 0, False)]
    summary = summarize(episodes, ["b", "a"])
    assert list(summary["tasks"]) == ["b", "a"]
    a = summary["tasks"]["a"]
    assert (a["episodes"], a["successes"], a["success_rate"]) == (4, 3, 0.75)
    assert a["ci95"] == list(wilson(3, 4)) and a["failures"] == {"time_limit": 1}
    assert a["latency_ms"]["p50"] == pytest.approx(51.5) and a["latency_ms"]["p99"] == pytest.approx(100.0)
    assert a["length"] == 11.5 and summary["overall"]["successes"] == 3 and summary["overall"]["episodes"] == 5


def test_compare_says_whether_intervals_overlap(tmp_path):
    for name, wins in (("a", 2), ("b", 20), ("c", 4)):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / RESULTS_FILE, "w") as f:
            for s in range(20):
                f.write(json.dumps(_episode("reach", s, s < wins)) + "\n")
    rows = compare(tmp_path / "a", tmp_path / "b")
    assert [r["task"] for r in rows] == ["reach", "overall"]
    assert rows[0]["diff"] == pytest.approx(0.9) and rows[0]["overlap"] is False
    assert compare(tmp_path / "a", tmp_path / "c")[0]["overlap"] is True
    text = format_comparison(rows, "a", "b")
    assert "2/20" in text and "20/20" in text and "+90.0%" in text and "disjoint" in text
    with pytest.raises(ConfigError, match="no results.jsonl"):
        compare(tmp_path / "a", tmp_path / "missing")


def test_report_draws_bars_whiskers_and_a_latency_histogram(tmp_path):
    episodes = [_episode("reach", s, s % 2 == 0, latency=(5.0 + s,)) for s in range(6)]
    episodes[0]["video"] = "videos/reach/seed0.mp4"
    page = write_report(tmp_path, summarize(episodes), episodes).read_text()
    assert page.count("<svg") == 2 and "3/6" in page and 'src="videos/reach/seed0.mp4"' in page
    assert page.count('stroke="#e45756"') == 6  # a whisker (line and two caps) for the task and overall


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
