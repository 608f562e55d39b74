"""``PolicyClient`` against the real server: reconnection, timeouts, errors; ``ActionChunker``'s schedule and
temporal ensembling."""

import subprocess
import sys
import time

import numpy as np
import pytest

from longboat.serving.client import ActionChunker, ActionChunks, PolicyClient, ServerError, ServerUnavailable
from longboat.serving.server_manager import free_port
from tests.serving.conftest import random_server, small_obs


def test_reconnects_after_the_server_restarts():
    with random_server() as (_, port):
        client = PolicyClient(port=port, connect_timeout_s=10)
        before = client.infer(small_obs(), seed=3)
    with random_server(port=port) as (_, again):  # a new server on the same port, as after a restart
        assert again == port
        after = client.infer(small_obs(), seed=3)
    assert client.reconnects == 1 and after["seed"] == 3
    np.testing.assert_array_equal(before["actions"], after["actions"])


def test_per_request_timeout_then_a_fresh_connection():
    with random_server(policy={"delay_ms": 1000}) as (_, port):
        client = PolicyClient(port=port, timeout_s=0.2)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="no reply within 0.2 s"):
            client.infer(small_obs())
        assert time.monotonic() - start < 0.9  # well before the reply (1 s)
        client.timeout_s = 30
        assert client.infer(small_obs(), seed=1)["actions"].shape == (10, 7)


def test_errors_are_raised_not_retried():
    with random_server(api_key="sesame") as (_, port):
        with pytest.raises(ServerError, match="HTTP 401"):
            PolicyClient(port=port, api_key="wrong")
        client = PolicyClient(port=port, api_key="sesame")
        with pytest.raises(ServerError, match="observation keys do not match"):
            client.infer({"nope": np.zeros(3)})
        assert client.infer(small_obs(), seed=2)["seed"] == 2  # the next request opens a new connection


def test_no_server_within_the_deadline():
    start = time.monotonic()
    with pytest.raises(ServerUnavailable, match="no policy server"):
        PolicyClient(port=free_port(), connect_timeout_s=0.5)
    assert time.monotonic() - start < 3


class _Chunks:
    """A policy whose chunk asked at call n is n*100 + [0, 1, ..., horizon-1] (one action dimension)."""

    def __init__(self, horizon: int):
        self.horizon, self.calls = horizon, 0

    def __call__(self, obs):
        chunk = self.calls * 100.0 + np.arange(self.horizon, dtype=np.float64)[:, None]
        self.calls += 1
        return {"actions": chunk}


def test_chunker_replans_every_k_steps():
    policy = _Chunks(horizon=5)
    chunker = ActionChunker(policy, replan_every=3)
    got = [chunker.step({})[0] for _ in range(7)]
    assert got == [0, 1, 2, 100, 101, 102, 200] and policy.calls == 3
    chunker.reset()
    assert chunker.step({})[0] == 300


def test_chunker_temporal_ensembling():
    policy = _Chunks(horizon=3)
    chunker = ActionChunker(policy, replan_every=1, ensemble_decay=0.5)
    got = [chunker.step({})[0] for _ in range(4)]
    w = np.exp(-0.5 * np.arange(3))
    assert got[0] == 0
    assert got[1] == pytest.approx((w[0] * 1 + w[1] * 100) / w[:2].sum())
    assert got[2] == pytest.approx((w[0] * 2 + w[1] * 101 + w[2] * 200) / w.sum())
    assert got[3] == pytest.approx((w[0] * 102 + w[1] * 201 + w[2] * 300) / w.sum())  # the first chunk is spent


def test_chunker_refuses_chunks_shorter_than_the_replanning_period():
    with pytest.raises(ServerError, match="horizon >= 4"):
        ActionChunker(_Chunks(horizon=3), replan_every=4).step({})


def test_client_and_manager_import_without_torch():
    """A simulator worker talks to the server without loading torch."""
    code = "import sys, longboat.serving.client, longboat.serving.server_manager; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _lerobot_ensemble(chunks: np.ndarray, coeff: float) -> np.ndarray:
    """LeRobot's ACT temporal ensemble written out directly, in float64: the chunk asked at step s covers steps
    s..s+H-1; step t averages the chunks covering it with weights exp(-coeff * i), i = 0 the oldest."""
    steps, horizon, _ = chunks.shape
    out = []
    for t in range(steps):
        votes = np.array([chunks[s, t - s] for s in range(max(0, t - horizon + 1), t + 1)], np.float64)
        w = np.exp(-coeff * np.arange(len(votes), dtype=np.float64))
        out.append((w[:, None] * votes).sum(0) / w.sum())
    return np.array(out)


def _running_ensemble_float32(chunks: np.ndarray, coeff: float) -> np.ndarray:
    """The same ensemble as LeRobot computes it at run time, in float32: each future step keeps a running weighted
    mean and a count of its votes; a new chunk's vote k is folded in as (mean * W[k-1] + a * w[k]) / W[k] with
    w = exp(-coeff * i) and W its cumulative sums."""
    steps, horizon, _ = chunks.shape
    w = np.exp(-coeff * np.arange(horizon, dtype=np.float32)).astype(np.float32)
    cum = np.cumsum(w, dtype=np.float32)
    means, counts, out = None, None, []
    for t in range(steps):
        new = chunks[t].astype(np.float32)
        if means is None:
            means, counts = new.copy(), np.ones(horizon, int)
        else:
            means = (means * cum[counts - 1][:, None] + new[:-1] * w[counts][:, None]) / cum[counts][:, None]
            means, counts = np.concatenate([means, new[-1:]]), np.concatenate([np.minimum(counts + 1, horizon), [1]])
        out.append(means[0])
        means, counts = means[1:], counts[1:]
    return np.array(out)


@pytest.mark.parametrize("coeff", [0.01, 0.5, 0.0, -0.2])
def test_temporal_ensemble_is_lerobots_and_the_chunker_uses_it(coeff):
    chunks = np.random.default_rng(0).standard_normal((15, 6, 3))
    want = _lerobot_ensemble(chunks, coeff)
    schedule = ActionChunks(replan=1, ensemble=coeff)
    got = []
    for t in range(len(chunks)):
        assert schedule.needs_chunk(t)
        schedule.add(t, chunks[t])
        got.append(schedule.action(t))
    np.testing.assert_allclose(np.array(got), want, rtol=1e-12, atol=1e-12)
    assert len(schedule.chunks) == 6  # chunks that no longer cover a step are dropped
    calls = iter(chunks)
    chunker = ActionChunker(lambda obs: {"actions": next(calls)}, replan_every=1, ensemble_decay=coeff)
    np.testing.assert_array_equal(np.array([chunker.step({}) for _ in range(len(chunks))]), np.array(got))
    # float32 chunks: the vote is taken in float64 and returned as float32
    schedule = ActionChunks(replan=1, ensemble=coeff)
    for t in range(len(chunks)):
        schedule.add(t, chunks[t].astype(np.float32))
        action = schedule.action(t)
        assert action.dtype == np.float32
        np.testing.assert_allclose(action, want[t], rtol=0, atol=1e-6)
    # LeRobot's float32 running form differs from the exact vote by float32 rounding only
    np.testing.assert_allclose(_running_ensemble_float32(chunks, coeff), want, rtol=0, atol=1e-5)


def test_chunk_schedule_replans_every_k_steps_and_the_ensemble_survives_a_large_negative_coefficient():
    schedule = ActionChunks(replan=3)
    asks = []
    for t in range(8):
        if schedule.needs_chunk(t):
            asks.append(t)
            schedule.add(t, np.full((4, 1), float(t)) + np.arange(4)[:, None])
        assert schedule.action(t)[0] == asks[-1] + t - asks[-1]
    assert asks == [0, 3, 6]
    schedule = ActionChunks(replan=1, ensemble=-50.0)  # exp(50 * i) overflows float64 by i = 15
    for t in range(20):
        schedule.add(t, np.full((20, 1), float(t)))
        action = schedule.action(t)
    assert np.isfinite(action).all() and action[0] == pytest.approx(19.0)  # the newest outweighs the rest
