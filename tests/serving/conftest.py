"""Servers for the serving and eval tests: the real ``PolicyServer`` on an event loop in a background thread, any
free port."""

from contextlib import contextmanager

import numpy as np
import pytest

from longboat.serving.random_policy import RandomPolicy, RandomPolicyConfig
from longboat.serving.server import PolicyServer, ServerConfig, serving_in_thread

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


def mlp_export(directory, state_dim: int = 39, action_dim: int = 4, horizon: int = 4):
    """An untrained state-only MLP written as a policy export (Meta-World's sizes by default): what a managed
    server serves in the tests that need a real ``longboat serve`` but not a trained policy."""
    import json

    import torch

    from longboat.checkpoint.export import save_export
    from longboat.data.robot.transforms import Pipeline, pipeline_assets
    from longboat.models.policy.mlp import MLPPolicy, MLPPolicyConfig

    cfg = MLPPolicyConfig(state_dim=state_dim, action_dim=action_dim, horizon=horizon, hidden_dim=16, n_layers=1)
    torch.manual_seed(0)
    manifest = {"format_version": 1, "wire_keys": {"observation.state": "observation.state"},
                "input_features": {"observation.state": {"shape": [state_dim]}},
                "horizon": horizon, "n_obs_steps": 1, "prompt": None}
    assets = {**pipeline_assets(Pipeline.from_config([], {})), "policy.json": json.dumps(manifest).encode()}
    return save_export(directory, MLPPolicy(cfg), "mlp", cfg.model_dump(mode="json"), assets,
                       extra={"task": "policy"})
