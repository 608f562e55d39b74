"""``longboat eval compare A B``: two runs' success side by side per task, the difference, and whether their
Wilson 95% intervals overlap (when they do, the runs are not shown to differ)."""

from __future__ import annotations

from pathlib import Path

from longboat.config.base import ConfigError
from longboat.eval.results import RESULTS_FILE, read_results, summarize


def load_summary(path: str | Path) -> dict:
    """The summary of a run directory, computed from its results file (so a run still going compares too)."""
    results = Path(path) / RESULTS_FILE
    if not results.is_file():
        raise ConfigError(f"{path}: no {RESULTS_FILE}; expected the output_dir of a `longboat eval` run")
    return summarize(read_results(results))


def compare(a: str | Path, b: str | Path) -> list[dict]:
    """One row per task of either run, then ``overall``: each side's rate and interval (None where absent)."""
    sa, sb = load_summary(a), load_summary(b)
    rows = []
    for task in [*sa["tasks"], *(t for t in sb["tasks"] if t not in sa["tasks"])] + ["overall"]:
        ga = sa["overall"] if task == "overall" else sa["tasks"].get(task)
        gb = sb["overall"] if task == "overall" else sb["tasks"].get(task)
        row = {"task": task, "a": ga, "b": gb, "diff": None, "overlap": None}
        if ga and gb:
            row["diff"] = gb["success_rate"] - ga["success_rate"]
            row["overlap"] = ga["ci95"][0] <= gb["ci95"][1] and gb["ci95"][0] <= ga["ci95"][1]
        rows.append(row)
    return rows


def format_comparison(rows: list[dict], a: str, b: str) -> str:
    def side(g):
        return f"{g['successes']}/{g['episodes']} {g['success_rate']:6.1%} [{g['ci95'][0]:.0%}, {g['ci95'][1]:.0%}]" \
            if g else "-"

    width = max(len(r["task"]) for r in rows)
    lines = [f"A: {a}", f"B: {b}",
             f"{'task':<{width}}  {'A':<26}  {'B':<26}  {'B - A':>7}  intervals"]
    for r in rows:
        diff = f"{r['diff']:+7.1%}" if r["diff"] is not None else f"{'-':>7}"
        overlap = "-" if r["overlap"] is None else ("overlap" if r["overlap"] else "disjoint")
        lines.append(f"{r['task']:<{width}}  {side(r['a']):<26}  {side(r['b']):<26}  {diff}  {overlap}")
    return "\n".join(lines)
