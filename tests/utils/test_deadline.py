"""``time_limit`` stops a block past its time in any thread, also right after a longer limit was watched, and
never raises into a thread whose block has ended."""

from __future__ import annotations

import threading
import time

import pytest

from longboat.utils.deadline import time_limit


class Late(Exception):
    pass


def spin():
    while True:
        pass


@pytest.mark.timeout(60)
def test_a_short_limit_after_a_long_one_is_kept():
    with time_limit(120, Late):
        pass
    start = time.monotonic()
    with pytest.raises(Late), time_limit(0.2, Late):
        spin()
    assert time.monotonic() - start < 5


@pytest.mark.timeout(60)
def test_each_thread_has_its_own_limit():
    stopped = []

    def run(seconds):
        start = time.monotonic()
        try:
            with time_limit(seconds, Late):
                spin()
        except Late:
            stopped.append((seconds, time.monotonic() - start))

    threads = [threading.Thread(target=run, args=(s,)) for s in (1.0, 0.2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(s for s, _ in stopped) == [0.2, 1.0] and all(took < s + 5 for s, took in stopped)


def test_a_block_that_ended_is_not_interrupted_later():
    with time_limit(0.05, Late):
        pass
    time.sleep(0.2)  # past the deadline: nothing may be raised into this thread now
