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


def dots(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images [n, 1, 3, 16, 16] with one 2x2 bright dot each, and the dot's centre in [-1, 1] as the action."""
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.randint(1, 14, (n,), generator=g), torch.randint(1, 14, (n,), generator=g)
    images = torch.zeros(n, 1, 3, 16, 16)
    for i, (y, x) in enumerate(zip(ys.tolist(), xs.tolist())):
        images[i, 0, :, y:y + 2, x:x + 2] = 1.0
    centre = torch.stack([xs, ys], -1).float() + 0.5
    return images, (centre / 7.5 - 1).view(n, 1, 2)


@pytest.mark.parametrize("keypoints", [None, 4])
def test_keypoints_locate_what_pooling_cannot(one_thread, keypoints):
    """Where a dot is, on held-out positions: learned keypoints find it; an average pool cannot tell."""
    torch.manual_seed(0)
    cfg = MLPPolicyConfig(image_features={CAM: [3, 16, 16]}, state_dim=0, state_feature=None, action_dim=2,
                          horizon=1, hidden_dim=64, image_channels=8, image_keypoints=keypoints)
    model = MLPPolicy(cfg)
    assert model.encoders[0].out_dim == 8  # 8 channels pooled, or 4 keypoints' (x, y)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    images, where = dots(64, seed=0)
    for _ in range(120):
        loss = model({CAM: images, "action": where, "action_is_pad": torch.zeros(64, 1, dtype=torch.bool)})
        opt.zero_grad()
        loss["loss"].mean().backward()
        opt.step()
    held_out, truth = dots(64, seed=1)
    error = (model.predict({CAM: held_out}) - truth).abs().mean().item()
    if keypoints is None:
        assert error > 0.25, error  # about 0.4: little better than guessing the middle (0.5)
    else:
        assert error < 0.05, error  # about 0.01
