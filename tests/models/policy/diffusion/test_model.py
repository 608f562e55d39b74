import pytest
import torch

from longboat.config.base import ConfigError, validate
from longboat.distributed.parallelize import parallel_units
from longboat.models import get_model
from longboat.models.policy.diffusion import DIFFUSION, DiffusionConfig, DiffusionPolicy
from longboat.trainer.metrics import read_metrics
from tests.conftest import run_longboat
from tests.tasks.policy_dataset import write_policy_dataset

CAMERA = "observation.images.top"


def tiny(cameras: bool = True, **over) -> DiffusionConfig:
    fields = {**DIFFUSION.load_preset("tiny"), "state_dim": 4, "action_dim": 3, **over}
    if cameras:
        fields["image_features"] = {CAMERA: [3, 32, 32], "observation.images.wrist": [1, 24, 24]}
    return DiffusionConfig(**fields)


def make_batch(cfg: DiffusionConfig, b: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch = {"observation.state": torch.randn(b, cfg.n_obs_steps, cfg.state_dim, generator=g),
             "action": torch.rand(b, cfg.horizon, cfg.action_dim, generator=g) * 2 - 1,
             "action_is_pad": torch.zeros(b, cfg.horizon, dtype=torch.bool),
             "noise_key": torch.arange(b, dtype=torch.int64) + 1000 * seed}
    for key, shape in cfg.image_features.items():
        batch[key] = torch.randn(b, cfg.n_obs_steps, *shape, generator=g)
    return batch


# ---- the policy --------------------------------------------------------------------------------------------
def test_shapes_and_registration():
    cfg = tiny()
    model = get_model("diffusion").build(cfg)
    assert isinstance(model, DiffusionPolicy)
    batch = make_batch(cfg, 3)
    out = model(batch)
    assert out["loss"].shape == (3,) and torch.all(out["loss"] > 0)
    assert model.predict(batch, batch["noise_key"]).shape == (3, cfg.horizon, cfg.action_dim)
    # The conditioning: per frame the state and each camera's features, over both frames.
    assert model.encoder(batch).shape == (3, cfg.n_obs_steps * (cfg.state_dim + 2 * cfg.image_feature_dim))
    # Every declared unit is a real module with a forward: the U-Net's levels and the cameras' encoders.
    units = parallel_units(model, DIFFUSION.parallel_units)
    assert len(units) == 2 + 2 + 2 + 1  # cameras, down levels, mid blocks, up levels
    model_state_only = DiffusionPolicy(tiny(cameras=False))
    assert model_state_only(make_batch(model_state_only.cfg, 2))["loss"].shape == (2,)


def test_meta_init_builds_the_default_initialisation():
    torch.manual_seed(0)
    reference = DiffusionPolicy(tiny())
    with torch.device("meta"):
        model = DiffusionPolicy(tiny())
    model.to_empty(device="cpu")
    model.init_weights()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.isfinite(p).all(), name
        assert p.std().item() == pytest.approx(q.std().item(), rel=0.5, abs=1e-6), name
    assert torch.isfinite(model(make_batch(model.cfg, 2))["loss"]).all()


def test_presets_build():
    for name in DIFFUSION.preset_names():
        cfg = validate(DiffusionConfig, {**DIFFUSION.load_preset(name), "state_dim": 4, "action_dim": 4,
                                         "image_features": {CAMERA: [3, 84, 84]}})
        model = DiffusionPolicy(cfg)
        assert model.predict(make_batch(cfg, 1), torch.tensor([1])).shape == (1, cfg.horizon, 4)


def test_loss_is_keyed_and_independent_of_batch_mates():
    cfg = tiny()
    model = DiffusionPolicy(cfg)
    batch = make_batch(cfg, 4)
    loss = model(batch)["loss"]
    torch.testing.assert_close(model(batch)["loss"], loss, rtol=0, atol=0)
    mates = {k: v[1:3] for k, v in batch.items()}
    torch.testing.assert_close(model(mates)["loss"], loss[1:3], rtol=1e-5, atol=1e-6)
    rekeyed = dict(batch, noise_key=batch["noise_key"] + 1)
    assert not torch.allclose(model(rekeyed)["loss"], loss)


def test_predict_is_a_function_of_the_noise_key():
    cfg = tiny()
    model = DiffusionPolicy(cfg).eval()
    batch = make_batch(cfg, 3)
    obs = {k: v for k, v in batch.items() if k.startswith("observation.")}
    keys = torch.tensor([5, 6, 7])
    a = model.predict(obs, keys)
    torch.testing.assert_close(model.predict(obs, keys), a, rtol=0, atol=0)
    # Ten denoising steps of batch-size-dependent kernels: float rounding, not the draw, differs.
    torch.testing.assert_close(model.predict({k: v[2:] for k, v in obs.items()}, keys[2:]), a[2:],
                               rtol=1e-4, atol=2e-5)
    assert not torch.allclose(model.predict(obs, keys + 1), a)
    assert a.abs().max() <= 1.0  # clip_sample


def test_mask_padding_leaves_padded_steps_out_of_the_loss():
    cfg = tiny(cameras=False, mask_padding=True)
    model = DiffusionPolicy(cfg)
    batch = make_batch(cfg, 2)
    batch["action_is_pad"][0, 5:] = True
    outputs = []
    model.unet.register_forward_hook(lambda module, args, out: outputs.append(out) or out.retain_grad())
    model(batch)["loss"].sum().backward()
    grad = outputs[0].grad
    assert torch.all(grad[0, 5:] == 0) and torch.all(grad[0, :5].abs().sum(-1) > 0)
    assert torch.all(grad[1].abs().sum(-1) > 0)


@pytest.mark.parametrize("fields, message", [
    ({"horizon": 7}, r"horizon 7 must be divisible by 2\^1"),
    ({"down_dims": [32, 66]}, "divisible by n_groups=4"),
    ({"state_feature": None}, "the policy sees nothing"),
    ({"inference_steps": 200}, "inference_steps 200 exceeds train_timesteps 100"),
])
def test_bad_configs_fail_naming_the_field(fields, message):
    base = {**DIFFUSION.load_preset("tiny"), "state_dim": 4, "action_dim": 3}
    if fields.get("state_feature", "x") is None:
        base["state_dim"] = 0
    with pytest.raises(ConfigError, match=message):
        validate(DiffusionConfig, {**base, **fields})
    with pytest.raises(ConfigError, match="model.action_dim is 0"):
        DiffusionPolicy(DiffusionConfig(**DIFFUSION.load_preset("tiny")))


@pytest.mark.slow
def test_tiny_preset_memorises_state_to_chunk():
    """Four states, four target chunks: after a few hundred Adam steps ``predict`` (10 DDIM steps from noise it
    never saw) returns each state's chunk. The clean-sample parameterisation memorises in this budget; epsilon,
    the default, needs thousands of steps for the same precision (the end-to-end test trains it)."""
    torch.manual_seed(0)
    cfg = tiny(cameras=False, prediction="sample")
    model = DiffusionPolicy(cfg)
    batch = make_batch(cfg, 4, seed=1)
    batch["action"] *= 0.9
    repeats = {k: v.repeat_interleave(4, 0) for k, v in batch.items()}  # more timesteps per step
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(100):
        repeats["noise_key"] = torch.arange(16) + 16 * step
        loss = model(repeats)["loss"].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    obs = {k: v for k, v in batch.items() if k.startswith("observation.")}
    actions = model.eval().predict(obs, torch.tensor([101, 102, 103, 104]))
    assert (actions - batch["action"]).abs().max() < 0.05


@pytest.mark.slow
def test_tiny_preset_trains_end_to_end(tmp_path):
    """``longboat train`` (task: policy) on a tiny dataset with a camera: the denoising loss falls from about 1 (an
    untrained network's noise prediction) and validation, run with the averaged (EMA) weights, follows it."""
    dataset = write_policy_dataset(tmp_path / "ds")
    run_dir = tmp_path / "run"
    transforms = ("[{type: normalize, features: {observation.state: min_max, action: min_max}}, "
                  "{type: random_crop, keys: [observation.images.top], size: [10, 14]}]")
    run_longboat("train", "configs/policy/diffusion_tiny.yaml", f"data.path={dataset}", f"run_dir={run_dir}",
                 "data.cameras=null", f"data.transforms={transforms}", "train.steps=200", "train.eval_every=0",
                 "train.log_every=10", "train.threads=1", "train.tensorboard=false", check=True)
    train, valid = read_metrics(run_dir), read_metrics(run_dir, "valid")
    assert train[0]["loss"] > 0.5 and train[-1]["loss"] < 0.3, (train[0]["loss"], train[-1]["loss"])
    assert valid[-1]["loss"] < 0.25 and "action_mae/dx" in valid[-1], valid[-1]
    assert (run_dir / "export").is_dir()
