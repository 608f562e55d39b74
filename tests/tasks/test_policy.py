"""The ``policy`` task: model features from the dataset, keyed and transformed windows, prompts, the loss and the
action error in robot units, export assets and the checkpoint state that carries them, and every bad input as one
line before any work."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from longboat.cli.main import main
from longboat.config.base import ConfigError
from longboat.data.robot import RobotDataset
from longboat.models.policy import noise_key
from longboat.models.policy.mlp import MLPPolicy, MLPPolicyConfig
from longboat.recipes.config import load_run_config, resolve
from longboat.tasks.policy import POLICY_SPEC, PolicyTask
from longboat.trainer.config import TrainerConfig
from tests.data.robot.lerobot_edit import copy_fixture
from tests.tasks.policy_dataset import ACTION, IMAGE, STATE, TASKS, write_policy_dataset

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "sft" / "tokenizer"
CAMERA = "observation.images.top"
NORMALIZE = {"type": "normalize", "features": {"observation.state": "mean_std", "action": "mean_std"}}
CROP = {"type": "random_crop", "keys": [CAMERA], "size": [10, 14]}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_policy_dataset(tmp_path_factory.mktemp("policy") / "ds")


def run_config(dataset: Path, tmp_path: Path, model: dict | None = None, **data) -> dict:
    return {"task": "policy", "run_dir": str(tmp_path / "run"), "seed": 3,
            "model": {"arch": "mlp", "preset": "tiny", **(model or {})},
            "data": {"path": str(dataset), "transforms": [NORMALIZE, CROP], "valid_fraction": 0.2, **data},
            "train": {"steps": 2, "micro_batch_size": 4, "num_workers": 0}}


def test_the_data_fills_the_models_features(dataset, tmp_path):
    resolved = resolve(run_config(dataset, tmp_path))
    cfg = resolved.model
    assert cfg.image_features == {CAMERA: [3, 10, 14]}  # the shape after the crop, not the stored one
    assert (cfg.state_dim, cfg.action_dim) == (STATE, ACTION)
    padded = resolve(run_config(dataset, tmp_path, transforms=[
        NORMALIZE, {"type": "pad_dim", "keys": ["action"], "dim": 6}], cameras=[])).model
    assert padded.image_features == {} and padded.action_dim == 6
    with pytest.raises(ConfigError, match=r"model.action_dim=3 disagrees with the data"):
        resolve(run_config(dataset, tmp_path, model={"action_dim": 3}))


def built(dataset: Path, tmp_path: Path, cfg_cls=MLPPolicyConfig, model: dict | None = None, **data):
    resolved = resolve(run_config(dataset, tmp_path, model, **data))
    cfg = cfg_cls(**resolved.model.model_dump(), **({} if cfg_cls is MLPPolicyConfig else {"tokenizer": str(TOKENIZER)}))
    task: PolicyTask = resolved.task
    return task, cfg, task.build(cfg, TrainerConfig(steps=2, micro_batch_size=4, device="cpu"), 3, 1)


def test_samples_hold_windows_keys_and_keyed_draws(dataset, tmp_path):
    task, cfg, data = built(dataset, tmp_path, model={"n_obs_steps": 2, "horizon": 5})
    sample = data.train[(7, 123)]
    assert set(sample) == {CAMERA, "observation.state", "action", "action_is_pad", "noise_key", "task"}
    assert sample[CAMERA].shape == (2, 3, 10, 14) and sample["observation.state"].shape == (2, STATE)
    assert sample["action"].shape == (5, ACTION) and sample["action_is_pad"].shape == (5,)
    assert int(sample["noise_key"]) == noise_key(3, 123) and sample["task"] in TASKS
    again, elsewhere = data.train[(7, 123)], data.train[(7, 124)]
    assert torch.equal(again[CAMERA], sample[CAMERA])  # the crop is drawn from (seed, position) ...
    assert not torch.equal(elsewhere[CAMERA], sample[CAMERA])  # ... so another position crops elsewhere
    assert torch.equal(elsewhere["action"], sample["action"])
    # Row 7 is frame 7 of the first training episode: its window starts at frame 6, normalised by the stats.
    stats = {k: torch.tensor(v, dtype=torch.float32) for k, v in task.meta.stats["observation.state"].items()}
    frames = RobotDataset(dataset, episodes=data.train.frames.episode_indices[:1])
    expected = (frames[6]["observation.state"] - stats["mean"]) / (stats["std"] + 1e-6)
    assert torch.allclose(sample["observation.state"][0], expected, atol=1e-5)
    # The end of an episode pads the chunk with its last action and says so.
    last = data.train[(19, 0)]
    assert last["action_is_pad"].tolist() == [False, True, True, True, True]
    assert torch.equal(last["action"][1], last["action"][0])
    # Validation holds other episodes, cropped at the centre every time.
    assert set(data.valid.frames.episode_indices).isdisjoint(data.train.frames.episode_indices)
    assert torch.equal(data.valid[(0, 5)][CAMERA], data.valid[(0, 9)][CAMERA])


def test_epoch_runs_keep_neighbouring_frames_together_and_read_them_in_order(dataset, tmp_path):
    from longboat.data.loader import EpochBatchSampler, EpochOrder, ResumableLoader

    _, _, data = built(dataset, tmp_path, model={"horizon": 5}, epoch_run=4)
    assert data.train.epoch_run == 4
    loader = ResumableLoader(data.train, 4, epochs=EpochOrder(global_batch=4, seed=0))
    batch = next(loader)
    keys = [int(k) for k in batch["noise_key"]]
    assert keys == [noise_key(3, p) for p in range(4)]  # positions still number the sample stream
    # The batch's items equal the ones read one at a time, whatever order __getitems__ read them in.
    first = next(iter(EpochBatchSampler(len(data.train), 4, 0, 1, 4, 0, positioned=True, run=4)))
    rows = sorted(row for row, _ in first)
    assert rows == list(range(rows[0], rows[0] + 4))  # one run of four neighbouring frames
    alone = [data.train[key] for key in first]
    assert all(torch.equal(a["action"], b) and torch.equal(a["observation.state"], c)
               for a, b, c in zip(alone, batch["action"], batch["observation.state"]))


class PromptedConfig(MLPPolicyConfig):
    tokenizer: str | None = None
    max_prompt_len: int = 6


def test_prompts_are_tokenized_padded_and_exported(dataset, tmp_path):
    task, cfg, data = built(dataset, tmp_path, PromptedConfig, cameras=[], transforms=[NORMALIZE])
    sample = data.train[(0, 0)]
    tokens, mask = sample["prompt_tokens"], sample["prompt_mask"]
    assert tokens.shape == mask.shape == (6,) and tokens.dtype == torch.int64 and mask.dtype == torch.bool
    ids = task._prompt_tokens(cfg).tokenizer.encode(sample["task"])
    n = min(len(ids), 6)
    assert tokens[:n].tolist() == ids[:n] and mask.sum() == n and not mask[n:].any()
    assets = task.export_assets()
    assert "tokenizer.json" in assets and json.loads(assets[POLICY_SPEC])["prompt"] == {"max_prompt_len": 6}


def test_eval_reports_the_action_error_in_robot_units(dataset, tmp_path):
    task, cfg, data = built(dataset, tmp_path, cameras=[], transforms=[NORMALIZE], valid_episodes=[1], valid_fraction=0)
    torch.manual_seed(0)
    model = MLPPolicy(cfg).eval()
    batch = torch.utils.data.default_collate([data.valid[(i, i)] for i in range(16, 20)])
    out = data.loss_fn(model, batch)
    assert out.count == 4 and torch.allclose(out.loss_sum, model(batch)["loss"].sum())
    # By hand: the normalised prediction back in robot units against the dataset's own actions.
    stats = {k: torch.tensor(v, dtype=torch.float32) for k, v in task.meta.stats["action"].items()}
    pred = model.predict(batch) * (stats["std"] + 1e-6) + stats["mean"]
    frames = RobotDataset(dataset, {"action": [i / 10 for i in range(4)]}, episodes=[1])
    true = torch.stack([frames[i]["action"] for i in range(16, 20)])
    real = (~batch["action_is_pad"]).float().unsqueeze(-1)
    per_dim = ((pred - true).abs() * real).sum(1) / real.sum(1)
    assert torch.allclose(torch.as_tensor(out.metrics["action_mae/dx"]), per_dim[:, 0].mean(), atol=1e-5)
    assert torch.allclose(torch.as_tensor(out.metrics["action_mae"]), per_dim.mean(), atol=1e-5)
    model.train()
    assert "action_mae" not in (data.loss_fn(model, batch).metrics or {})


def test_assets_ride_in_the_checkpoint_state(dataset, tmp_path):
    task, cfg, _ = built(dataset, tmp_path)
    assets = task.export_assets()
    assert {"transforms.json", "transforms.safetensors", POLICY_SPEC} <= set(assets)
    spec = json.loads(assets[POLICY_SPEC])
    assert spec["input_features"][CAMERA] == {"shape": [*IMAGE, 3], "dtype": "image", "model_shape": [3, 10, 14]}
    assert spec["output_features"]["action"]["names"] == ["dx", "dy"]
    assert spec["wire_keys"] == {CAMERA: CAMERA, "observation.state": "observation.state"}
    assert (spec["fps"], spec["horizon"], spec["tasks"]) == (10, 4, list(TASKS))
    fresh = PolicyTask(task.data)
    with pytest.raises(ConfigError, match="neither is at hand"):
        fresh.export_assets()
    fresh.load_state_dict(task.state_dict())
    assert fresh.export_assets() == assets


@pytest.mark.parametrize("override, message", [
    ("data.cameras=[observation.images.side]", "data.cameras: 'observation.images.side' is not a camera of"),
    ("model.horizon=25", "model.horizon=25 is longer than episode 0 of"),
    ("model.state_feature=observation.joints", "model.state_feature: 'observation.joints' is not a feature of"),
    ("model.arch=decoder", "model.arch 'decoder' is not a model task 'policy' trains"),
    ("data.valid_episodes=[9]", "data.valid_episodes: [9] are not among the selected episodes"),
    ("data.episodes=[0,7]", "data.episodes: episodes [7] are not in"),
    ("data.wire_keys={cam: observation.images.side}", "data.wire_keys.cam: 'observation.images.side' is not an"),
    ("data.wire_keys={cam: observation.images.top}", "data.wire_keys: no wire key maps to ['observation.state']"),
    ("data.transforms=[{type: normalize, features: {observation.effort: mean_std}}]",
     "needs stats of 'observation.effort'"),
    ("data.path=/nonexistent", "data.path: /nonexistent: not a LeRobot dataset"),
])
def test_bad_input_fails_in_one_line(dataset, tmp_path, capsys, override, message):
    config = tmp_path / "policy.yaml"
    config.write_text(json.dumps(run_config(dataset, tmp_path, valid_fraction=0)))
    code = main(["train", str(config), override, "--check"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_a_prompt_tokenizer_larger_than_the_backbone_vocabulary_fails_in_one_line(dataset, tmp_path, capsys):
    config = tmp_path / "vla.yaml"
    config.write_text(json.dumps(run_config(dataset, tmp_path, model={"arch": "flow_vla", "tokenizer": str(TOKENIZER)},
                                            cameras=[], transforms=[NORMALIZE], valid_fraction=0)))
    code = main(["train", str(config), "model.backbone.vocab_size=100", "--check"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "has 436 tokens, more than model.backbone.vocab_size=100" in err


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "policy").glob("*.yaml")), ids=lambda p: p.name)
def test_every_policy_config_loads(dataset, tmp_path, path):
    data = yaml.safe_load(path.read_text())["data"]
    if data.get("cameras"):  # a recipe naming cameras gets a dataset with those, 64 px or 8 more than its crop
        crops = [max(t["size"]) for t in data.get("transforms", []) if t["type"] in ("random_crop", "center_crop")]
        side = max([64, *(c + 8 for c in crops)])
        dataset = write_policy_dataset(tmp_path / "ds", episodes=2, length=20, camera_key=data["cameras"],
                                       image=(side, side))
    resolved = load_run_config(path, [f"data.path={dataset}"])
    assert resolved.cfg.task == "policy" and resolved.model.action_dim == ACTION
    resolved.task.check(resolved.model)


@pytest.mark.parametrize("check", [True, False], ids=["check", "train"])
def test_a_dataset_with_fps_nan_fails_before_training(dataset, tmp_path, capsys, check):
    """fps NaN passed ``fps <= 0``: training ran to the end on windows padded everywhere, exit 0."""
    copy = Path(shutil.copytree(dataset, tmp_path / "ds"))
    info = json.loads((copy / "meta/info.json").read_text())
    (copy / "meta/info.json").write_text(json.dumps({**info, "fps": float("nan")}))
    config = tmp_path / "policy.yaml"
    config.write_text(json.dumps(run_config(copy, tmp_path, valid_fraction=0)))
    code = main(["train", str(config), *(["--check"] if check else [])])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"data.path: {copy / 'meta/info.json'}: 'fps': expected a finite positive number, got nan" in err
    assert not (tmp_path / "run").exists()


def test_a_missing_video_of_a_later_episode_fails_the_check(tmp_path, capsys):
    """Building the model reads only the first episode: a video missing further on surfaced mid-training."""
    root = copy_fixture("v21", tmp_path / "ds")
    video = root / "videos/chunk-000/observation.images.cam/episode_000002.mp4"
    video.unlink()
    code = main(["train", str(REPO / "configs/policy/mlp_tiny.yaml"), f"data.path={root}",
                 f"run_dir={tmp_path / 'run'}", "data.cameras=[observation.images.cam]", "--check"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"data.path: {video}: video file of 'observation.images.cam' not found" in err


def test_a_transform_from_a_plugin_passes_the_check(dataset, tmp_path, capsys, point_plugin):
    """The run config's ``plugins:`` (relative to the config) registers the transform its pipeline names."""
    config = tmp_path / "policy.yaml"
    scale = {"type": "point_scale", "key": "action", "factor": 2.0}
    fields = run_config(dataset, tmp_path, cameras=[], transforms=[NORMALIZE, scale], valid_fraction=0)
    config.write_text(json.dumps(fields))
    assert main(["train", str(config), "--check"]) == 2
    err = capsys.readouterr().err
    assert "unknown transform 'point_scale'" in err and err.count("\n") == 1, err
    config.write_text(json.dumps({**fields, "plugins": [os.path.relpath(point_plugin, tmp_path)]}))
    assert main(["train", str(config), "--check"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("ok: task policy · model mlp")
