"""Robot policies trained by behaviour cloning on a LeRobot dataset (v3.0 or v2.1).

The dataset decides the model's features: the cameras (``data.cameras``, all by default) with their shapes after
the transforms, and the state and action sizes. Episodes are split whole into training and validation
(``data.valid_episodes``, or ``data.valid_fraction`` drawn by the run's seed). The loss is the policy's own
per-sample loss, summed and counted per sample; validation adds the action error in the robot's units (the
transforms' inverses applied to ``predict``'s chunk and to the target), overall and per action dimension.

Checkpoints (task state) and exports carry what serving needs with nothing else at hand: the transform pipeline
with its statistics (``transforms.json``, ``transforms.safetensors``) and ``policy.json``: features and shapes,
fps, window sizes, the map from observation keys on the wire to dataset features, and the dataset's prompts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator

from longboat.config.base import ConfigError, StrictModel
from longboat.data.robot import DatasetMeta, RobotDataError, RobotDataset, split_episodes
from longboat.data.robot.prompts import PromptTokens
from longboat.data.robot.transforms import Pipeline, pipeline_assets
from longboat.data.tokenizer import Tokenizer, TokenizerError
from longboat.distributed.loss import LossFn, LossOutput, unwrap
from longboat.models.policy.base import PolicyConfig, observation_keys
from longboat.models.policy.manifest import POLICY_SPEC, POLICY_SPEC_VERSION
from longboat.tasks.base import Task, TaskData, fill_from_data, register_task
from longboat.tasks.policy_data import BatchTransforms, PolicyWindows, delta_timestamps
from longboat.tasks.pretrain import tokenizer_assets
from longboat.trainer.optim import ParamGroup
from longboat.utils.device import resolve_device
from longboat.utils.logging import console

_STATE_PREFIX = "asset/"  # task state: each export asset's bytes as a uint8 tensor


class PolicyDataConfig(StrictModel):
    path: str = Field(description="a LeRobot dataset directory (v3.0 or v2.1)")
    episodes: list[int] | None = Field(default=None, description="the episodes to use; null: all")
    valid_episodes: list[int] | None = Field(default=None, description="episodes held out for validation")
    valid_fraction: float = Field(default=0.0, ge=0, lt=1, description="share of episodes held out, drawn by seed")
    transforms: list[dict] = Field(default_factory=list, description="the transform pipeline (Pipeline.from_config)")
    cameras: list[str] | None = Field(default=None, description="camera features the policy sees; null: all")
    wire_keys: dict[str, str] | None = Field(
        default=None, description="observation key on the wire -> dataset feature; null: each feature's own name")
    epoch_run: int = Field(default=1, ge=1, description=(
        "neighbouring frames the shuffled epochs keep together: >1 decodes the video frames their windows share "
        "once, at the cost of batches drawn from fewer episodes"))
    transforms_on: Literal["auto", "device", "workers"] = Field(default="auto", description=(
        "where the transforms run: 'workers' (the loader's, sample by sample), 'device' (cameras leave the workers "
        "as uint8; the batch is converted to float and transformed on the training device, with the same keyed "
        "draws), 'auto' (the device when training on an accelerator, else the workers)"))
    max_prompt_len: int | None = Field(default=None, gt=0,
                                       description="prompt tokens per sample; null: the model's max_prompt_len")
    stats: dict[str, dict[str, list]] | None = Field(
        default=None, description="feature -> statistic -> values replacing the dataset's (an imported policy's "
        "own normalisation: model.lerobot sets them, so a resumed run needs the policy's directory no more)")

    @model_validator(mode="after")
    def _one_split(self):
        if self.valid_episodes is not None and self.valid_fraction > 0:
            raise ValueError("set valid_episodes or valid_fraction, not both")
        return self


@register_task("policy")
class PolicyTask(Task):
    """Behaviour cloning: the policy's loss over windows of a robot dataset."""

    data_config = PolicyDataConfig
    model_config = PolicyConfig
    unit = "samples"
    epochs = True

    def __init__(self, data: PolicyDataConfig):
        super().__init__(data)
        self._meta: DatasetMeta | None = None
        self._assets: dict[str, bytes] | None = None  # set by build, or by a checkpoint's task state
        #: set by build on the device path: the transforms of training and evaluation batches, which the loss runs
        self.batch_transforms: tuple[BatchTransforms, BatchTransforms] | None = None

    # ---- the dataset -------------------------------------------------------------------------------------------
    @property
    def meta(self) -> DatasetMeta:
        if self._meta is None:
            try:
                self._meta = DatasetMeta(self.data.path)
            except RobotDataError as e:
                raise ConfigError(f"data.path: {e}") from None
        return self._meta

    def _pool(self) -> list[int]:
        """The selected episodes (``data.episodes``, all by default), checked to exist."""
        known = self.meta.episodes.index.tolist()
        if self.data.episodes is None:
            return known
        for key, episodes in (("episodes", self.data.episodes), ("valid_episodes", self.data.valid_episodes or [])):
            missing = sorted(set(episodes) - set(known))
            if missing:
                raise ConfigError(f"data.{key}: episodes {missing} are not in {self.data.path} "
                                  f"(episodes {min(known)}..{max(known)})")
        return sorted(set(self.data.episodes))

    def _split(self, seed: int) -> tuple[list[int], list[int]]:
        pool = self._pool()
        if self.data.valid_episodes is None:
            try:
                return split_episodes(pool, self.data.valid_fraction, seed)
            except RobotDataError as e:
                raise ConfigError(f"data.valid_fraction: {e}") from None
        valid = sorted(set(self.data.valid_episodes))
        outside = sorted(set(valid) - set(pool))
        if outside:
            raise ConfigError(f"data.valid_episodes: {outside} are not among the selected episodes of {self.data.path}")
        train = [e for e in pool if e not in valid]
        if not train:
            raise ConfigError("data.valid_episodes: holds out every selected episode; none is left for training")
        return train, valid

    def pipeline(self, train: bool, seed: int = 0) -> Pipeline:
        stats = {**(self.meta.stats or {}), **(self.data.stats or {})}
        return Pipeline.from_config(self.data.transforms, stats, source=self.data.path + " stats",
                                    prefix="data.transforms", seed=seed, train=train)

    def _frames(self, cfg: PolicyConfig, episodes: list[int], image_dtype: str = "float32") -> RobotDataset:
        try:
            return RobotDataset(self.data.path, delta_timestamps(cfg, self.meta.fps), episodes,
                                cameras=list(cfg.image_features), image_dtype=image_dtype,
                                epoch_run=self.data.epoch_run, meta=self.meta)
        except RobotDataError as e:
            raise ConfigError(f"data.path: {e}") from None

    def _known_feature(self, key: str, field: str) -> None:
        if key not in self.meta.features:
            raise ConfigError(f"model.{field}: '{key}' is not a feature of {self.data.path} "
                              f"(features: {', '.join(self.meta.features)})")

    # ---- the model from the data -------------------------------------------------------------------------------
    def configure_model(self, fields: dict) -> dict:
        """Cameras and their shapes after the transforms (one eval-mode sample), state and action sizes."""
        defaults = PolicyConfig.model_fields
        cameras = self.data.cameras if self.data.cameras is not None else self.meta.camera_keys
        for key in cameras:
            if key not in self.meta.camera_keys:
                raise ConfigError(f"data.cameras: '{key}' is not a camera of {self.data.path} "
                                  f"(cameras: {', '.join(self.meta.camera_keys) or 'none'})")
        state = fields.get("state_feature", defaults["state_feature"].default)
        action = fields.get("action_feature", defaults["action_feature"].default)
        if state is not None:
            self._known_feature(state, "state_feature")
        self._known_feature(action, "action_feature")
        probe = PolicyConfig(
            image_features={k: [1, 1, 1] for k in cameras}, state_feature=state, action_feature=action,
            horizon=fields.get("horizon", defaults["horizon"].default),
            n_obs_steps=fields.get("n_obs_steps", defaults["n_obs_steps"].default))
        sample = PolicyWindows(self._frames(probe, self._pool()[:1]), self.pipeline(train=False), probe, 0)[0]
        found = {"image_features": {k: list(sample[k].shape[-3:]) for k in cameras},
                 "action_dim": int(sample[action].shape[-1])}
        if state is not None:
            found["state_dim"] = int(sample[state].shape[-1])
        return fill_from_data(fields, found, self.data.path)

    def check(self, model_cfg: PolicyConfig) -> None:
        if not isinstance(model_cfg, PolicyConfig):
            raise ConfigError(f"task policy trains policies; {type(model_cfg).__name__} is not a PolicyConfig")
        for key in model_cfg.image_features:
            if key not in self.meta.camera_keys:
                raise ConfigError(f"model.image_features: '{key}' is not a camera of {self.data.path} "
                                  f"(cameras: {', '.join(self.meta.camera_keys) or 'none'})")
        if model_cfg.state_feature is not None:
            self._known_feature(model_cfg.state_feature, "state_feature")
        self._known_feature(model_cfg.action_feature, "action_feature")
        pool = set(self._pool())
        eps = self.meta.episodes
        for key in model_cfg.image_features:  # every video the run will read is there (building reads the first)
            if key in self.meta.video_keys:
                try:
                    self.meta.video_paths(key, [eps.position(e) for e in sorted(pool)])
                except RobotDataError as e:
                    raise ConfigError(f"data.path: {e}") from None
        lengths = {int(e): int(n) for e, n in zip(eps.index, eps.length) if int(e) in pool}
        shortest = min(lengths, key=lengths.get)
        if model_cfg.horizon > lengths[shortest]:
            raise ConfigError(f"model.horizon={model_cfg.horizon} is longer than episode {shortest} of "
                              f"{self.data.path} ({lengths[shortest]} frames); lower model.horizon or leave the "
                              "short episodes out with data.episodes")
        self._split(0)
        self.pipeline(train=True)
        used = set(observation_keys(model_cfg))
        if self.data.wire_keys is not None:
            for wire, feature in self.data.wire_keys.items():
                if feature not in used:
                    raise ConfigError(f"data.wire_keys.{wire}: '{feature}' is not an observation the policy reads "
                                      f"({', '.join(sorted(used))})")
            unmapped = sorted(used - set(self.data.wire_keys.values()))
            if unmapped:
                raise ConfigError(f"data.wire_keys: no wire key maps to {unmapped}, which the policy reads")
        tokenizer = getattr(model_cfg, "tokenizer", None)
        if tokenizer is not None:
            self._prompt_tokens(model_cfg)

    def _prompt_tokens(self, model_cfg: PolicyConfig) -> PromptTokens | None:
        tokenizer = getattr(model_cfg, "tokenizer", None)
        if tokenizer is None:
            return None
        model_len = getattr(model_cfg, "max_prompt_len", None)
        length = self.data.max_prompt_len or model_len
        if length is None:
            raise ConfigError("data.max_prompt_len: the model reads prompts but sets no max_prompt_len; set one")
        if model_len is not None and length > model_len:
            raise ConfigError(f"data.max_prompt_len={length} exceeds model.max_prompt_len={model_len}")
        try:
            tok = Tokenizer(tokenizer)
        except TokenizerError as e:
            raise ConfigError(f"model.tokenizer: {e}") from None
        backbone = getattr(model_cfg, "backbone", None)
        if backbone is not None and tok.vocab_size > backbone.vocab_size:
            # An id past the embedding table would fail only when a prompt first uses it, mid-training.
            raise ConfigError(f"model.tokenizer: {tokenizer} has {tok.vocab_size} tokens, more than "
                              f"model.backbone.vocab_size={backbone.vocab_size}")
        return PromptTokens(tok, length)

    # ---- data and loss -----------------------------------------------------------------------------------------
    def transforms_on_device(self, train_cfg) -> bool:
        """``data.transforms_on`` resolved: ``auto`` is the device when the run trains on an accelerator."""
        if self.data.transforms_on == "auto":
            return resolve_device(train_cfg.device).type != "cpu"
        return self.data.transforms_on == "device"

    def build(self, model_cfg: PolicyConfig, train_cfg, seed: int, dp_size: int) -> TaskData:
        train_eps, valid_eps = self._split(seed)
        prompts = self._prompt_tokens(model_cfg)
        on_device = self.transforms_on_device(train_cfg)
        image_dtype = "uint8" if on_device else "float32"

        def windows(episodes: list[int], training: bool) -> PolicyWindows:
            return PolicyWindows(self._frames(model_cfg, episodes, image_dtype), self.pipeline(training, seed),
                                 model_cfg, seed, prompts, transform=not on_device)

        train = windows(train_eps, True)
        valid = None
        if valid_eps:
            valid = windows(valid_eps, False)
            if len(valid) < train_cfg.micro_batch_size * dp_size:
                raise ConfigError(f"data: the validation episodes hold {len(valid)} frames, fewer than one "
                                  f"micro-batch on every rank ({train_cfg.micro_batch_size} × {dp_size})")
        on_batch = None
        if on_device:
            on_batch = (BatchTransforms(train.pipeline, model_cfg, train.frames.to_float),
                        BatchTransforms(self.pipeline(train=False), model_cfg, train.frames.to_float))
        self.batch_transforms = on_batch
        pipeline = self.pipeline(train=False)
        self._assets = {**pipeline_assets(pipeline), POLICY_SPEC: self._policy_spec(model_cfg)}
        if prompts is not None:  # a served policy tokenizes its prompts as training did
            files = tokenizer_assets(model_cfg.tokenizer)
            self._assets.update({name: path.read_bytes() for name, path in files.items()})
        summary = {"train_episodes": len(train_eps), "train_frames": len(train), "valid_episodes": len(valid_eps),
                   "valid_frames": len(valid) if valid is not None else 0}
        summary["transforms_on"] = "device" if on_device else "workers"
        loss = make_policy_loss(pipeline, model_cfg, self._action_names(model_cfg), on_batch)
        return TaskData(train, valid, loss, summary)

    def _action_names(self, cfg: PolicyConfig) -> list[str]:
        """A name per action dimension: the dataset's ``names`` when it lists one per dimension, else indices."""
        feature = self.meta.features[cfg.action_feature]
        names = feature.names
        if isinstance(names, dict) and len(names) == 1:  # LeRobot's {"motors": [...]}
            names = next(iter(names.values()))
        size = feature.shape[-1]
        if isinstance(names, list) and len(names) == size and all(isinstance(n, str) for n in names):
            return names
        return [str(i) for i in range(size)]

    def _policy_spec(self, cfg: PolicyConfig) -> bytes:
        meta = self.meta

        def feature(key: str, model_shape: list[int]) -> dict:
            """As stored (shape, dtype) and as the model sees it after the transforms."""
            return {"shape": list(meta.features[key].shape), "dtype": meta.features[key].dtype,
                    "model_shape": model_shape}

        inputs = {key: feature(key, shape) for key, shape in cfg.image_features.items()}
        if cfg.state_feature is not None:
            inputs[cfg.state_feature] = feature(cfg.state_feature, [cfg.state_dim])
        action = {**feature(cfg.action_feature, [cfg.action_dim]), "names": self._action_names(cfg)}
        spec = {
            "format_version": POLICY_SPEC_VERSION,
            "fps": meta.fps,
            "robot_type": meta.info.get("robot_type"),
            "horizon": cfg.horizon,
            "n_obs_steps": cfg.n_obs_steps,
            "input_features": inputs,
            "output_features": {cfg.action_feature: action},
            "wire_keys": self.data.wire_keys or {key: key for key in inputs},
            "tasks": list(meta.tasks),
            "prompt": ({"max_prompt_len": self._prompt_tokens(cfg).length}
                       if getattr(cfg, "tokenizer", None) is not None else None),
        }
        return (json.dumps(spec, indent=2) + "\n").encode()

    # ---- checkpoints and exports -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {_STATE_PREFIX + name: torch.frombuffer(bytearray(content), dtype=torch.uint8)
                for name, content in (self._assets or {}).items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        saved = {k.removeprefix(_STATE_PREFIX): bytes(v.numpy().tobytes()) for k, v in state.items()
                 if k.startswith(_STATE_PREFIX)}
        if self._assets is not None and saved and saved != self._assets:
            console.print("[yellow]warning:[/] the dataset's statistics, transforms or features differ from those "
                          "the checkpoint was trained with; training goes on with the new ones")
            return
        self._assets = saved

    def param_groups(self, model: torch.nn.Module) -> list[ParamGroup] | None:
        """The policy's own components and learning-rate scales (e.g. a VLA's backbone, slower or frozen)."""
        groups = model.param_groups()
        return None if groups is None else [ParamGroup(names, lr_scale) for names, lr_scale in groups.values()]

    def export_assets(self) -> dict[str, Path | bytes]:
        if self._assets is None:
            raise ConfigError(f"data.path: {self.data.path}: the policy's assets come from a built task or a "
                              "checkpoint's task state, and neither is at hand")
        return dict(self._assets)


def make_policy_loss(pipeline: Pipeline, cfg: PolicyConfig, action_names: list[str],
                     on_batch: tuple[BatchTransforms, BatchTransforms] | None = None) -> LossFn:
    """The policy's summed per-sample loss; in evaluation also the action error in robot units. ``on_batch``: the
    transforms of training and of evaluation batches, when they run here on the device rather than in the workers
    (the model's mode says which batch this is)."""

    def policy_loss(model: torch.nn.Module, batch: dict) -> LossOutput:
        if on_batch is not None:
            batch = on_batch[0 if model.training else 1](batch)
        out = model(batch)
        loss = out["loss"]
        n = loss.shape[0]
        metrics = {k: v.detach().float().mean() for k, v in out.items() if k != "loss"}
        if not model.training:
            metrics.update(action_errors(unwrap(model), batch, pipeline, cfg, action_names))
        return LossOutput(loss.sum(), n, n, metrics)

    return policy_loss


@torch.no_grad()
def action_errors(policy, batch: dict, pipeline: Pipeline, cfg: PolicyConfig,
                  action_names: list[str]) -> dict[str, torch.Tensor]:
    """Mean absolute error of ``predict``'s chunk over the real steps, in robot units: overall and per dimension."""
    obs = {k: v for k, v in batch.items() if k not in (cfg.action_feature, "action_is_pad")}
    pred = policy.predict(obs, noise_key=batch["noise_key"]).float()
    first = batch[cfg.action_feature].shape[1] - pred.shape[1]  # a chunk predicted from a later step (first_action)
    context = {cfg.state_feature: batch[cfg.state_feature]} if cfg.state_feature is not None else {}
    robot_pred = pipeline.unapply({**context, cfg.action_feature: pred})[cfg.action_feature]
    target = batch[cfg.action_feature][:, first:].float()
    robot_true = pipeline.unapply({**context, cfg.action_feature: target})[cfg.action_feature]
    real = (~batch["action_is_pad"][:, first:]).float().unsqueeze(-1)  # [B, H, 1]
    per_dim = ((robot_pred - robot_true).abs() * real).sum(1) / real.sum(1).clamp(min=1)  # [B, A]
    per_dim = per_dim.mean(0)
    return {"action_mae": per_dim.mean(), **{f"action_mae/{name}": v for name, v in zip(action_names, per_dim)}}
