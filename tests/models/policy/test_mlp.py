"""The behaviour-cloning MLP: shapes, the padded steps left out of the loss, per-sample independence, and a fixed
batch overfitted by a plain Adam loop."""

import pytest
import torch

from longboat.models import build_model, get_model
from longboat.models.policy.mlp import MLPPolicy, MLPPolicyConfig

CAM = "observation.images.top"


def config(**kw) -> MLPPolicyConfig:
    fields = dict(image_features={CAM: [3, 12, 16]}, state_dim=4, action_dim=2, horizon=5, n_obs_steps=2,
                  hidden_dim=32, image_channels=4)
    return MLPPolicyConfig(**{**fields, **kw})


def batch(b: int = 6, seed: int = 0, cfg: MLPPolicyConfig | None = None) -> dict:
    cfg = cfg or config()
    g = torch.Generator().manual_seed(seed)
    out = {"observation.state": torch.randn(b, cfg.n_obs_steps, cfg.state_dim, generator=g),
           "action": torch.randn(b, cfg.horizon, cfg.action_dim, generator=g),
           "action_is_pad": torch.zeros(b, cfg.horizon, dtype=torch.bool),
           "noise_key": torch.arange(b, dtype=torch.int64), "task": ["reach"] * b}
    for key, shape in cfg.image_features.items():
        out[key] = torch.rand(b, cfg.n_obs_steps, *shape, generator=g)
    return out


def test_shapes_and_the_registered_presets():
    torch.manual_seed(0)
    model = MLPPolicy(config())
    x = batch()
    assert model(x)["loss"].shape == (6,)
    assert model.predict(x).shape == (6, 5, 2)
    assert get_model("mlp").preset_names() == ["default", "tiny"]
    tiny = build_model("mlp", {**get_model("mlp").load_preset("tiny"), "state_dim": 4, "action_dim": 2})
    assert tiny.predict(batch(cfg=tiny.cfg)).shape == (6, tiny.cfg.horizon, 2)
    assert len(tiny.encoders) == 0  # no camera, no encoder


def test_padded_steps_do_not_count_and_samples_are_independent():
    torch.manual_seed(0)
    model = MLPPolicy(config(loss="mse"))
    x = batch()
    x["action_is_pad"][:, 3:] = True
    loss = model(x)["loss"]
    moved = {**x, "action": x["action"].clone()}
    moved["action"][:, 3:] += 100.0
    torch.testing.assert_close(model(moved)["loss"], loss)
    mates = batch(seed=1)
    mixed = {k: (torch.cat([v[:2], mates[k][2:]]) if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
    mixed["action_is_pad"] = x["action_is_pad"]
    torch.testing.assert_close(model(mixed)["loss"][:2], loss[:2])


def test_overfits_a_fixed_batch(one_thread):
    torch.manual_seed(0)
    model = MLPPolicy(config())
    x = batch(b=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = model(x)["loss"].mean().item()
    for _ in range(150):
        loss = model(x)["loss"].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 0.5 and loss.item() < 0.05, (first, loss.item())
