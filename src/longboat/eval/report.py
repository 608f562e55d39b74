"""``report.html``: success per task with Wilson 95% whiskers, a histogram of request latencies and the episode
videos, failures first with their reason, as one self-contained page (inline SVG; the videos are mp4 files beside
it)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from longboat.utils.outputs import replace_file

REPORT_FILE = "report.html"
_W, _BAR_H = 640, 28
_CHAR_W = 7.5  # an upper bound on a 12 px sans-serif character's advance, to keep every label inside the chart


def write_video(path: Path, frames: list[np.ndarray], fps: int) -> None:
    """uint8 RGB frames [H, W, 3] as an H.264 mp4 that browsers play."""
    from longboat.data.robot.encode import VideoFileEncoder, VideoOptions

    h, w = frames[0].shape[:2]
    encoder = VideoFileEncoder(path, fps, w, h, VideoOptions(codec="h264", gop=fps, crf=23))
    encoder.add(np.stack(frames))
    encoder.close()


def _success_chart(rows: list[tuple[str, dict]]) -> str:
    # Room for the longest task name on the left (long ones are cut, the full name in a tooltip) and the longest
    # "successes/episodes" on the right, so no label leaves the picture.
    names = [(n if len(n) <= 40 else n[:39] + "…") for n, _ in rows]
    counts = [f"{g['successes']}/{g['episodes']}" for _, g in rows]
    left = 12 + _CHAR_W * max(len(n) for n in names)
    right = 12 + _CHAR_W * max(len(c) for c in counts)
    width = _W - left - right
    height = _BAR_H * len(rows) + 30
    parts = [f'<svg width="{_W}" height="{height}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" '
             f'font-size="12">']
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        x = left + tick * width
        parts.append(f'<line x1="{x}" y1="0" x2="{x}" y2="{height - 20}" stroke="#ddd"/>'
                     f'<text x="{x}" y="{height - 5}" text-anchor="middle">{tick:.0%}</text>')
    for i, ((name, g), shown, count) in enumerate(zip(rows, names, counts)):
        y = i * _BAR_H + 4
        low, high = g["ci95"]
        tooltip = f"<title>{html.escape(name)}</title>" if shown != name else ""
        parts.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{html.escape(shown)}{tooltip}</text>'
                     f'<rect x="{left}" y="{y}" width="{g["success_rate"] * width:.1f}" height="{_BAR_H - 8}" '
                     f'fill="{"#555" if name == "overall" else "#4c78a8"}"/>'
                     f'<line x1="{left + low * width:.1f}" x2="{left + high * width:.1f}" y1="{y + 10}" y2="{y + 10}" '
                     f'stroke="#e45756" stroke-width="2"/>'
                     + "".join(f'<line x1="{left + v * width:.1f}" x2="{left + v * width:.1f}" y1="{y + 4}" '
                               f'y2="{y + 16}" stroke="#e45756" stroke-width="2"/>' for v in (low, high))
                     + f'<text x="{left + width + 6}" y="{y + 15}">{count}</text>')
    return "".join(parts) + "</svg>"


def _histogram(values: list[float], bins: int = 30) -> str:
    if not values:
        return "<p>no requests</p>"
    counts, edges = np.histogram(values, bins=bins)
    left, width, height = 50, _W - 70, 180
    bar = width / bins
    parts = [f'<svg width="{_W}" height="{height + 40}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" '
             f'font-size="12"><line x1="{left}" y1="{height}" x2="{left + width}" y2="{height}" stroke="#999"/>']
    for i, c in enumerate(counts):
        h = height * c / counts.max()
        parts.append(f'<rect x="{left + i * bar:.1f}" y="{height - h:.1f}" width="{bar - 1:.1f}" height="{h:.1f}" '
                     f'fill="#72b7b2"><title>{edges[i]:.1f}-{edges[i + 1]:.1f} ms: {c}</title></rect>')
    parts.append(f'<text x="{left}" y="{height + 16}">{edges[0]:.1f} ms</text>'
                 f'<text x="{left + width}" y="{height + 16}" text-anchor="end">{edges[-1]:.1f} ms</text>'
                 f'<text x="{left - 6}" y="12" text-anchor="end">{counts.max()}</text>')
    return "".join(parts) + "</svg>"


def _table(summary: dict) -> str:
    head = "<tr><th>task</th><th>success</th><th>95% CI</th><th>reward</th><th>length</th>" \
           "<th>latency p50/p95/p99 (ms)</th></tr>"
    rows = []
    for name, g in [*summary["tasks"].items(), ("overall", summary["overall"])]:
        lat = g["latency_ms"]
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{g['successes']}/{g['episodes']} "
                    f"({g['success_rate']:.1%})</td><td>{g['ci95'][0]:.1%} – {g['ci95'][1]:.1%}</td>"
                    f"<td>{g['reward']:.2f}</td><td>{g['length']:.1f}</td>"
                    f"<td>{lat['p50']} / {lat['p95']} / {lat['p99']}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _clip(e: dict) -> str:
    outcome = "success" if e["success"] else f"failure: {e['failure'] or 'not solved'}"
    return (f'<figure class="{"success" if e["success"] else "failure"}"><video src="{html.escape(e["video"])}" '
            f'controls loop muted width="256"></video><figcaption>seed {e["seed"]}: {html.escape(outcome)}, '
            f'{e["length"]} steps</figcaption></figure>')


def write_report(directory: Path, summary: dict, episodes: list[dict]) -> Path:
    rows = [*summary["tasks"].items(), ("overall", summary["overall"])]
    videos = []
    for task in summary["tasks"]:
        clips = sorted((e for e in episodes if e["task"] == task and e.get("video")),
                       key=lambda e: (bool(e["success"]), e["seed"]))  # failures first
        if clips:
            videos.append(f"<h3>{html.escape(task)}</h3>" + "".join(_clip(e) for e in clips))
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>longboat eval</title><style>
body{{font-family:sans-serif;margin:2em;max-width:60em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} figure{{display:inline-block;margin:0 1em 1em 0}}
figure.failure figcaption{{color:#b22}} figcaption{{max-width:256px}}
</style></head><body><h1>{html.escape(summary.get("benchmark", ""))}: {html.escape(str(summary.get("policy", "")))}</h1>
{_schedule(summary.get("chunk_schedule"))}
<h2>Success (bars) with Wilson 95% intervals (whiskers)</h2>{_success_chart(rows)}
{_table(summary)}
<h2>Request latency (round trip)</h2>{_histogram([x for e in episodes for x in e["latency_ms"]])}
<h2>Episodes</h2>{"".join(videos) or "<p>no videos</p>"}
</body></html>
"""
    return replace_file(directory / REPORT_FILE, page)


def _schedule(schedule: dict | None) -> str:
    """The header line saying how the episodes used the policy's chunks."""
    if not schedule:
        return ""
    if schedule.get("temporal_ensemble") is not None:
        how = f"temporal ensemble (coefficient {schedule['temporal_ensemble']:g}), a chunk asked every step"
    else:
        how = f"{schedule['replan_steps']} actions of each chunk"
    by = ", ".join(f"{k} from {v}" for k, v in (schedule.get("set_by") or {}).items())
    return f"<p>Chunks: {html.escape(how)}{html.escape(f' ({by})' if by else '')}</p>"
