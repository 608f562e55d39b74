"""Comparing two evaluations: per-task success with intervals, and whether they overlap."""

import json

import pytest

from longboat.config.base import ConfigError
from longboat.eval.compare import compare, format_comparison
from longboat.eval.results import RESULTS_FILE
from tests.eval.conftest import episode


def test_compare_says_whether_intervals_overlap(tmp_path):
    for name, wins in (("a", 2), ("b", 20), ("c", 4)):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / RESULTS_FILE, "w") as f:
            for s in range(20):
                f.write(json.dumps(episode("reach", s, s < wins)) + "\n")
    rows = compare(tmp_path / "a", tmp_path / "b")
    assert [r["task"] for r in rows] == ["reach", "overall"]
    assert rows[0]["diff"] == pytest.approx(0.9) and rows[0]["overlap"] is False
    assert compare(tmp_path / "a", tmp_path / "c")[0]["overlap"] is True
    text = format_comparison(rows, "a", "b")
    assert "2/20" in text and "20/20" in text and "+90.0%" in text and "disjoint" in text
    with pytest.raises(ConfigError, match="no results.jsonl"):
        compare(tmp_path / "a", tmp_path / "missing")

