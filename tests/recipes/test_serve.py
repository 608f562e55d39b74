"""A policy export served end to end: wire keys to features, the exported transforms in and out, seeds as noise
keys. The policy is a randomly initialised one written to the contract (``Policy.predict``)."""

import json

import numpy as np
import pytest
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from torch import nn

from longboat.checkpoint.export import save_export
from longboat.config.base import ConfigError
from longboat.data.robot.transforms import Pipeline, pipeline_assets
from longboat.models import ModelSpec, register_model
from longboat.models.policy import Policy, PolicyConfig, keyed_normal
from longboat.recipes.serve import open_served_policy
from longboat.serving.served import RequestError
from longboat.serving.server import PolicyServer, ServerConfig, serving_in_thread

CAM, STATE = "observation.images.front", "observation.state"


class _LinearPolicy(Policy):
    """Per-channel image means and the current state, through one linear layer, plus keyed noise."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__(cfg)
        width = sum(shape[0] for shape in cfg.image_features.values()) + cfg.state_dim
        self.head = nn.Linear(width * cfg.n_obs_steps, cfg.horizon * cfg.action_dim)

    @torch.no_grad()
    def predict(self, obs, noise_key=None):
        parts = [obs[k].mean(dim=(-2, -1)).flatten(1) for k in self.cfg.image_features] + [obs[STATE].flatten(1)]
        shape = (self.cfg.horizon, self.cfg.action_dim)
        out = self.head(torch.cat(parts, 1)).reshape(-1, *shape)
        return out + keyed_normal(noise_key, shape) if noise_key is not None else out


register_model(ModelSpec(name="served_linear_test", config=PolicyConfig, module=_LinearPolicy))


def _export(tmp_path, n_obs_steps=1, wire_keys=None):
    cfg = PolicyConfig(image_features={CAM: [3, 16, 16]}, state_dim=4, action_dim=2, horizon=5,
                       n_obs_steps=n_obs_steps)
    torch.manual_seed(0)
    model = _LinearPolicy(cfg)
    stats = {STATE: {"mean": torch.arange(4.0), "std": torch.full((4,), 2.0)},
             "action": {"mean": torch.tensor([10.0, -10.0]), "std": torch.tensor([3.0, 0.5])}}
    pipeline = Pipeline.from_config([{"type": "resize_pad", "keys": [CAM], "size": [16, 16]},
                                     {"type": "normalize", "features": {STATE: "mean_std", "action": "mean_std"}}],
                                    stats)
    manifest = {"format_version": 1, "wire_keys": wire_keys or {"observation/image": CAM, "observation/state": STATE},
                "input_features": {CAM: {"shape": [24, 32, 3]}, STATE: {"shape": [4]}},
                "horizon": 5, "n_obs_steps": n_obs_steps, "prompt": None}
    assets = {**pipeline_assets(pipeline), "policy.json": json.dumps(manifest).encode()}
    out = save_export(tmp_path / "export", model, "served_linear_test", cfg.model_dump(mode="json"), assets,
                      extra={"task": "policy"})
    return out, model, pipeline.eval()


def _wire(i):
    rng = np.random.default_rng(i)
    return {"observation/image": rng.integers(0, 256, (24, 32, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(4).astype(np.float32) * 3}


def _by_hand(model, pipeline, obs, seed):
    batch = {CAM: torch.from_numpy(obs["observation/image"]).permute(2, 0, 1).float().div(255)[None, None],
             STATE: torch.from_numpy(obs["observation/state"])[None, None]}
    x = pipeline.apply(batch)
    chunk = model.predict(x, noise_key=torch.tensor([seed]))
    return pipeline.unapply({**x, "action": chunk})["action"][0].numpy()


def test_served_export_answers_in_robot_units(tmp_path):
    directory, model, pipeline = _export(tmp_path)
    server = PolicyServer(open_served_policy(tmp_path), ServerConfig(port=0, batch_window_ms=20))  # the run dir
    with serving_in_thread(server) as port:
        client = WebsocketClientPolicy("127.0.0.1", port)
        meta = client.get_server_metadata()
        assert meta["policy"] == "_LinearPolicy" and meta["horizon"] == 5 and meta["action_dim"] == 2
        assert meta["observation_shapes"] == {"observation/image": [24, 32, 3], "observation/state": [4]}
        for i in range(3):
            got = client.infer({**_wire(i), "seed": 40 + i, "prompt": "push the block"})
            np.testing.assert_allclose(got["actions"], _by_hand(model, pipeline, _wire(i), 40 + i), atol=1e-5)
        assert abs(got["actions"][:, 0].mean() - 10) < abs(got["actions"][:, 0].mean() + 10)  # un-normalised
        with pytest.raises(RuntimeError, match=r"expected frames of shape \[24, 32, 3\], got \[24, 24, 3\]"):
            client.infer({**_wire(0), "observation/image": np.zeros((24, 24, 3), np.uint8)})


def test_observation_history_needs_its_time_axis(tmp_path):
    _export(tmp_path, n_obs_steps=2)
    policy = open_served_policy(tmp_path / "export")
    with pytest.raises(RequestError, match=r"'observation/image': expected \[2, H, W, C\] \(the last 2 frames"):
        policy.check(_wire(0))
    two = {k: np.stack([v, v]) for k, v in _wire(0).items()}
    policy.check(two)
    assert policy.infer([two], [1])[0]["actions"].shape == (5, 2)


def test_manifest_must_map_every_feature(tmp_path):
    _export(tmp_path, wire_keys={"observation/image": CAM})
    with pytest.raises(ConfigError, match=r"unmapped: \['observation.state'\]"):
        open_served_policy(tmp_path)


def test_a_checkpoint_is_not_served(tmp_path):
    (tmp_path / "config.yaml").write_text("{}\n")
    with pytest.raises(ConfigError, match="longboat export RUN_DIR"):
        open_served_policy(tmp_path)
