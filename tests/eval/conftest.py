"""Servers for the eval tests: the real ``PolicyServer`` on an event loop in a background thread, any free port."""

from contextlib import contextmanager

import numpy as np
import pytest

from longboat.eval.random_policy import RandomPolicy, RandomPolicyConfig
from longboat.eval.server import PolicyServer, ServerConfig, serving_in_thread

SMALL = {"observation/image": [32, 32, 3], "observation/state": [8]}


def small_obs(i: int = 0) -> dict:
    rng = np.random.default_rng(i)
    return {"observation/image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8).astype(np.float32), "prompt": "stack the blocks"}


@contextmanager
def random_server(**server_fields):
    policy_fields = server_fields.pop("policy", {})
    policy = RandomPolicy(RandomPolicyConfig(**{"observation": SMALL, **policy_fields}))
    server = PolicyServer(policy, ServerConfig(**{"port": 0, **server_fields}))
    with serving_in_thread(server) as port:
        yield server, port


@pytest.fixture
def served():
    with random_server() as (server, port):
        yield server, port
