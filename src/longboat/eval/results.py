"""``results.jsonl`` (one line per finished episode, appended and flushed as it ends) and ``summary.json``.

A run killed at any moment leaves whole lines plus at most one torn last line, which opening the file again cuts
off; the episodes already written are not run again, the one that was cut off is run from its start (episodes are
deterministic given their seed), so the file ends with each episode exactly once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from longboat.config.base import ConfigError
from longboat.utils.outputs import replace_file
from longboat.utils.stats import wilson_interval

RESULTS_FILE, SUMMARY_FILE, RUN_FILE = "results.jsonl", "summary.json", "run.json"


class ResultsFile:
    """Append-only episode results; ``done`` holds the (task, seed) pairs already in the file."""

    def __init__(self, path: Path):
        self.path = path
        self.episodes = read_results(path, repair=True) if path.exists() else []
        self.done = {(e["task"], e["seed"]) for e in self.episodes}
        self._out = open(path, "a", encoding="utf-8")

    def append(self, episode: dict) -> None:
        key = (episode["task"], episode["seed"])
        if key in self.done:
            raise RuntimeError(f"episode {key} is already in {self.path}")
        self._out.write(json.dumps(episode, separators=(",", ":")) + "\n")
        self._out.flush()
        os.fsync(self._out.fileno())
        self.done.add(key)
        self.episodes.append(episode)

    def close(self) -> None:
        self._out.close()


def read_results(path: Path, repair: bool = False) -> list[dict]:
    """The episodes in ``path``; a torn last line (a run killed mid-write) is cut off when ``repair``, skipped
    otherwise. A bad line elsewhere is an error: the file was edited or is not a results file."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail: after the last newline (empty when the file ends whole)
    episodes = []
    for number, line in enumerate(complete, 1):
        try:
            episode = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{number}: not a JSON line; is this a results file?") from None
        problem = _not_an_episode(episode)
        if problem:
            raise ConfigError(f"{path}:{number}: not an episode ({problem}); is this a results file?")
        episodes.append(episode)
    if tail and repair:
        with open(path, "r+b") as f:
            f.truncate(len(data) - len(tail))
    return episodes


# What summaries, reports and resuming read of an episode line, with the types they read it as.
_EPISODE_FIELDS = {"task": (str,), "seed": (int,), "success": (bool,), "reward": (int, float), "length": (int,),
                   "latency_ms": (list,)}


def _not_an_episode(episode) -> str | None:
    if not isinstance(episode, dict):
        return f"expected an object, got {type(episode).__name__}"
    for key, types in _EPISODE_FIELDS.items():
        value = episode.get(key)
        if value is None or not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"'{key}': expected {' or '.join(t.__name__ for t in types)}, got {json.dumps(value)[:40]}"
    return None


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50, 95, 99])
    return {"p50": round(float(p50), 3), "p95": round(float(p95), 3), "p99": round(float(p99), 3)}


def _group(episodes: list[dict]) -> dict:
    n, k = len(episodes), sum(bool(e["success"]) for e in episodes)
    low, high = wilson_interval(k, n)
    failures: dict[str, int] = {}
    for e in episodes:
        if e.get("failure"):
            failures[e["failure"]] = failures.get(e["failure"], 0) + 1
    return {"episodes": n, "successes": k, "success_rate": k / n if n else 0.0, "ci95": [low, high],
            "reward": float(np.mean([e["reward"] for e in episodes])) if n else 0.0,
            "length": float(np.mean([e["length"] for e in episodes])) if n else 0.0,
            "latency_ms": _percentiles([x for e in episodes for x in e["latency_ms"]]),
            "failures": failures}


def summarize(episodes: list[dict], tasks: list[str] | None = None) -> dict:
    """Per task (in ``tasks`` order, else first seen) and overall: success rate, successes/N, Wilson 95%
    interval, mean reward and length, request latency p50/p95/p99, failure reasons."""
    order = list(tasks or dict.fromkeys(e["task"] for e in episodes))
    return {"tasks": {t: _group([e for e in episodes if e["task"] == t]) for t in order},
            "overall": _group(episodes)}


def write_summary(directory: Path, summary: dict) -> Path:
    return write_json(directory / SUMMARY_FILE, summary)


def write_json(path: Path, data: dict) -> Path:
    """``path`` whole or not at all: written beside it, then renamed over it."""
    return replace_file(path, json.dumps(data, indent=2) + "\n")
