"""``PolicyClient`` against the real server: reconnection, timeouts, errors; ``ActionChunker``'s schedule and
temporal ensembling."""

import subprocess
import sys
import time

import numpy as np
import pytest

from longboat.serving.client import ActionChunker, PolicyClient, ServerError, ServerUnavailable
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
