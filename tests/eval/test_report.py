"""The HTML report: success bars with whiskers, a latency histogram and the videos, failures first; and the page
as headless Chromium shows it."""

import numpy as np
import pytest
from PIL import Image

from longboat.eval.report import write_report, write_video
from longboat.eval.results import summarize
from tests.eval.browser import CHROMIUM, open_page
from tests.eval.conftest import episode


def test_report_draws_bars_whiskers_and_a_latency_histogram(tmp_path):
    episodes = [episode("reach", s, s % 2 == 0, latency=(5.0 + s,)) for s in range(6)]
    episodes[0]["video"] = "videos/reach/seed0.mp4"
    page = write_report(tmp_path, summarize(episodes), episodes).read_text()
    assert page.count("<svg") == 2 and "3/6" in page and 'src="videos/reach/seed0.mp4"' in page
    assert page.count('stroke="#e45756"') == 6  # a whisker (line and two caps) for the task and overall



@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium); .ci/run installs it")
def test_the_report_as_a_browser_shows_it(tmp_path):
    """Rendered in headless Chromium: every chart label inside its picture (the longest count and task name too),
    one playable video per filmed episode, failures first with their reason, no console error."""
    long_task = "pick-place-wall-with-a-rather-long-name-that-is-cut-v3"
    episodes = [episode("push-v3", s, s >= 12, latency=(20.0 + s,)) for s in range(150)]
    episodes += [episode(long_task, s, s % 3 == 0) for s in range(9)]
    for e in episodes:
        if not e["success"]:
            e["failure"] = "time_limit"
    rng = np.random.default_rng(0)
    filmed = [episodes[0], episodes[20], episodes[21], episodes[150], episodes[151]]  # 2 failures, 2 successes, ...
    for e in filmed:
        e["video"] = f"videos/{e['task']}/seed{e['seed']}.mp4"
        (tmp_path / e["video"]).parent.mkdir(parents=True, exist_ok=True)
        write_video(tmp_path / e["video"], [rng.integers(0, 255, (64, 64, 3), dtype=np.uint8) for _ in range(8)], 10)
    page_file = write_report(tmp_path, summarize(episodes), episodes)
    with open_page(page_file) as page:
        outside = page.evaluate("""[...document.querySelectorAll('svg')].flatMap(svg => {
            const box = svg.getBoundingClientRect();
            return [...svg.querySelectorAll('text')].map(t => [t.textContent, t.getBoundingClientRect()])
              .filter(([, r]) => r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5
                                 || r.bottom > box.bottom + 0.5)
              .map(([text]) => text);
        })""")
        assert outside == [], f"labels outside their chart: {outside}"
        labels = page.evaluate("[...document.querySelectorAll('svg text')].map(t => t.firstChild.textContent)")
        assert "138/150" in labels and "overall" in labels and long_task[:39] + "…" in labels
        videos = page.evaluate("""Promise.all([...document.querySelectorAll('video')].map(v => new Promise(done => {
            const report = () => done([v.getAttribute('src'), v.readyState, v.error && v.error.code]);
            if (v.readyState >= 1 || v.error) report();
            else { v.addEventListener('loadedmetadata', report); v.addEventListener('error', report);
                   setTimeout(report, 10000); }
        })))""")
        assert sorted(src for src, _, _ in videos) == sorted(e["video"] for e in filmed)
        assert all(ready >= 1 and error is None for _, ready, error in videos), videos
        captions = page.evaluate("[...document.querySelectorAll('figcaption')].map(c => c.textContent)")
        outcomes = [c.split(":")[1].split(",")[0].strip() for c in captions]
        assert outcomes == ["failure", "success", "success", "failure", "success"]  # per task, failures first
        assert captions[0] == "seed 0: failure: time_limit, 10 steps"
        shot = page.screenshot(tmp_path / "report.png")
        assert page.errors == []
    with Image.open(shot) as image:
        assert image.width >= 640 and image.height > 600
