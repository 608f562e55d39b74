"""ACT: shapes, keyed CVAE draws (a sample's loss ignores its batch mates), padded steps left out, a deterministic
``predict``, a fixed batch overfitted by a plain Adam loop, bad configs, and the tiny preset trained end to end."""

import pytest
import torch

from longboat.config.base import ConfigError, validate
from longboat.models import build_model, get_model
from longboat.models.policy.act import ACT, ACTConfig
from longboat.models.policy.act.transformer import sinusoid_2d
from longboat.recipes.artifact import open_artifact
from longboat.serving.policy_bundle import open_policy
from longboat.trainer.metrics import read_metrics
from tests.conftest import run_longboat
from tests.tasks.policy_dataset import ACTION, write_policy_dataset

CAM = "observation.images.top"
FEATURES = {"image_features": {CAM: [3, 32, 32]}, "state_dim": 4, "action_dim": 3}


def tiny(**over) -> ACT:
    torch.manual_seed(0)
    return build_model("act", {**get_model("act").load_preset("tiny"), **FEATURES, **over})


def make_batch(n: int, seed: int, horizon: int = 10) -> dict:
    g = torch.Generator().manual_seed(seed)
    is_pad = torch.zeros(n, horizon, dtype=torch.bool)
    is_pad[0, horizon - 3:] = True  # the episode ends inside the first sample's chunk
    return {
        CAM: torch.rand(n, 1, 3, 32, 32, generator=g),
        "observation.state": torch.randn(n, 1, 4, generator=g),
        "action": torch.randn(n, horizon, 3, generator=g),
        "action_is_pad": is_pad,
        "noise_key": torch.arange(n) + 1000 * seed,
        "task": ["push"] * n,
    }


def test_shapes_of_the_loss_and_the_action_chunk():
    model = tiny()
    batch = make_batch(5, 0)
    out = model(batch)
    assert set(out) == {"loss", "l1", "kl"} and all(v.shape == (5,) for v in out.values())
    torch.testing.assert_close(out["loss"], out["l1"] + 10.0 * out["kl"])
    assert (out["kl"] >= 0).all()
    assert model.predict(batch).shape == (5, 10, 3)


def test_image_positions_tell_every_cell_apart():
    pos = sinusoid_2d(3, 5, 16)
    assert pos.shape == (15, 16) and pos.abs().max() <= 1
    assert torch.cdist(pos, pos).add(torch.eye(15)).min() > 0.1  # no two cells share a position
    grid = pos.view(3, 5, 16)
    torch.testing.assert_close(grid[:, :1, :8].expand(3, 5, 8), grid[..., :8])  # the first half encodes the row
    torch.testing.assert_close(grid[:1, :, 8:].expand(3, 5, 8), grid[..., 8:])  # the second half the column


def test_two_cameras_and_no_state():
    feats = {"image_features": {CAM: [3, 32, 32], "observation.images.wrist": [3, 24, 40]}, "state_feature": None}
    model = tiny(**feats)
    batch = make_batch(2, 0)
    del batch["observation.state"]
    batch["observation.images.wrist"] = torch.rand(2, 1, 3, 24, 40)
    assert model(batch)["loss"].shape == (2,)
    assert model.predict(batch).shape == (2, 10, 3)


def test_training_draws_are_keyed_by_the_sample():
    model = tiny()
    batch = make_batch(4, 0)
    loss = model(batch)["loss"]
    torch.testing.assert_close(model(batch)["loss"], loss, rtol=0, atol=0)  # same keys: the same latent sample
    other_keys = dict(batch, noise_key=batch["noise_key"] + 1)
    assert not torch.allclose(model(other_keys)["loss"], loss)
    # A sample's loss does not depend on its batch mates (GroupNorm backbone, keyed latent).
    mates = make_batch(4, 1)
    mixed = {k: torch.cat([batch[k][:1], mates[k][1:]]) for k in batch if k != "task"}
    torch.testing.assert_close(model(mixed)["loss"][0], loss[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model({k: v[:1] for k, v in batch.items()})["loss"], loss[:1], rtol=1e-5, atol=1e-6)


def test_padded_actions_do_not_count():
    model = tiny()
    batch = make_batch(2, 0)
    changed = dict(batch, action=batch["action"].clone())
    changed["action"][0, -3:] += 5.0  # the padded steps of sample 0
    torch.testing.assert_close(model(changed)["loss"], model(batch)["loss"])


def test_predict_is_deterministic_and_per_sample():
    model = tiny().eval()
    batch = make_batch(3, 0)
    actions = model.predict(batch)
    torch.testing.assert_close(model.predict(batch, noise_key=torch.tensor([7, 8, 9])), actions, rtol=0, atol=0)
    torch.testing.assert_close(model.predict({k: v[1:2] for k, v in batch.items()}), actions[1:2],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_tiny_preset_overfits_a_fixed_batch():
    model = tiny()
    batch = make_batch(8, 0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for step in range(120):
        batch["noise_key"] = torch.arange(8) + 8 * step  # as in training, a fresh latent sample every step
        loss = model(batch)["loss"].mean()
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 10 and loss.item() < 0.2, (first, loss.item())  # 23.9 -> 0.086 here
    # At the prior's mean latent the chunk matches the demonstrations too (actions ~ N(0, 1): L1 0.8 at chance).
    real = ~batch["action_is_pad"]
    assert (model.eval().predict(batch) - batch["action"]).abs()[real].mean() < 0.2


def test_meta_init_builds_a_working_model():
    cfg = validate(ACTConfig, {**get_model("act").load_preset("tiny"), **FEATURES})
    with torch.device("meta"):
        model = ACT(cfg)
    model.to_empty(device="cpu")
    model.init_weights()
    assert torch.isfinite(model(make_batch(2, 0))["loss"]).all()


@pytest.mark.parametrize("over, key", [
    ({"n_obs_steps": 2}, "n_obs_steps"),
    ({"d_model": 30}, "d_model"),
    ({"image_features": {CAM: [3, 32, 32], "observation.images.depth": [1, 32, 32]}}, "channel count"),
    ({"image_features": {}, "state_feature": None}, "needs an observation"),
])
def test_bad_configs_fail_in_one_line(over, key):
    with pytest.raises(ConfigError, match=key) as err:
        build_model("act", {**get_model("act").load_preset("tiny"), **FEATURES, **over})
    assert "\n" not in str(err.value)


def test_action_dim_must_be_known_before_building():
    with pytest.raises(ConfigError, match="action_dim is 0"):
        build_model("act", {"image_features": {CAM: [3, 32, 32]}, "state_dim": 4})


def test_default_preset_is_resnet18_shaped():
    cfg = validate(ACTConfig, get_model("act").load_preset("default"))
    assert cfg == ACTConfig()  # the class defaults are the default preset
    assert cfg.backbone.widths == [64, 128, 256, 512] and cfg.backbone.blocks == [2, 2, 2, 2]
    assert (cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.latent_dim, cfg.kl_weight) == (4, 1, 32, 10.0)


@pytest.mark.slow
def test_tiny_act_trains_end_to_end(tmp_path):
    dataset = write_policy_dataset(tmp_path / "ds")
    run_dir = tmp_path / "run"
    transforms = ("[{type: normalize, features: {observation.state: mean_std, action: mean_std}}, "
                  "{type: random_crop, keys: [observation.images.top], size: [10, 14]}]")
    run_longboat("train", "configs/policy/act_tiny.yaml", f"data.path={dataset}", f"run_dir={run_dir}",
                 f"data.transforms={transforms}", "train.threads=1", "train.tensorboard=false", check=True)
    train, valid = read_metrics(run_dir), read_metrics(run_dir, "valid")
    # The mean loss of the first 20 steps is about 1.1 (the KL term starts near 2 nats), the last about 0.1.
    assert train[0]["loss"] > 0.5 and train[-1]["loss"] < 0.2, (train[0]["loss"], train[-1]["loss"])
    assert train[-1]["kl"] < 0.01 and {"l1", "kl"} <= set(valid[-1])
    # Held-out episode, in the dataset's units (actions span about [-2, 2]); 0.11 here.
    assert valid[-1]["action_mae"] < 0.25, valid[-1]
    served = open_policy(open_artifact(run_dir))
    obs = {CAM: torch.rand(2, 1, 3, 12, 16),  # raw frames: the export's pipeline crops them to the model's 10x14
           "observation.state": torch.randn(2, 1, 4), "task": ["push the block"] * 2}
    assert served.act(obs).shape == (2, 10, ACTION)
