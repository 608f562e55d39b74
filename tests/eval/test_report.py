"""The HTML report: success bars with whiskers, a latency histogram and the videos."""

from longboat.eval.report import write_report
from longboat.eval.results import summarize
from tests.eval.conftest import episode


def test_report_draws_bars_whiskers_and_a_latency_histogram(tmp_path):
    episodes = [episode("reach", s, s % 2 == 0, latency=(5.0 + s,)) for s in range(6)]
    episodes[0]["video"] = "videos/reach/seed0.mp4"
    page = write_report(tmp_path, summarize(episodes), episodes).read_text()
    assert page.count("<svg") == 2 and "3/6" in page and 'src="videos/reach/seed0.mp4"' in page
    assert page.count('stroke="#e45756"') == 6  # a whisker (line and two caps) for the task and overall

