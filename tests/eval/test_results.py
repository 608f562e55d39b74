"""Results file and summary statistics: what an evaluation writes per episode and sums per task."""

import pytest

from longboat.config.base import ConfigError
from longboat.eval.results import RESULTS_FILE, ResultsFile, read_results, summarize
from longboat.utils.stats import wilson_interval as wilson
from tests.eval.conftest import episode


def test_results_file_cuts_a_torn_line_and_refuses_duplicates(tmp_path):
    path = tmp_path / RESULTS_FILE
    results = ResultsFile(path)
    results.append(episode("a", 0, True))
    results.append(episode("a", 1, False))
    with pytest.raises(RuntimeError, match="already"):
        results.append(episode("a", 1, True))
    results.close()
    with open(path, "a") as f:
        f.write('{"task": "a", "seed": 2, "succ')  # killed mid-write
    resumed = ResultsFile(path)
    assert resumed.done == {("a", 0), ("a", 1)}
    resumed.append(episode("a", 2, True))
    resumed.close()
    assert [e["seed"] for e in read_results(path)] == [0, 1, 2]
    path.write_text("not json\n")
    with pytest.raises(ConfigError, match=":1: not a JSON line"):
        ResultsFile(path)


def test_summary_per_task_and_overall():
    episodes = [episode("a", s, s < 3, latency=(float(s), 100.0)) for s in range(4)] + [episode("b", 0, False)]
    summary = summarize(episodes, ["b", "a"])
    assert list(summary["tasks"]) == ["b", "a"]
    a = summary["tasks"]["a"]
    assert (a["episodes"], a["successes"], a["success_rate"]) == (4, 3, 0.75)
    assert a["ci95"] == list(wilson(3, 4)) and a["failures"] == {"time_limit": 1}
    assert a["latency_ms"]["p50"] == pytest.approx(51.5) and a["latency_ms"]["p99"] == pytest.approx(100.0)
    assert a["length"] == 11.5 and summary["overall"]["successes"] == 3 and summary["overall"]["episodes"] == 5

