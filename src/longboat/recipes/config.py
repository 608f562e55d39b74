"""The training run's config: one file for every task, resolved and validated before any work starts.

Order: plugins are imported (they may register the task or model), the task's ``train_defaults`` are merged under
the user's ``train:``, the run's sections are validated, the task's data config is validated and the task completes
the model fields its data determines, then the model config (preset + user fields + data) is validated against its
architecture.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from longboat.config.base import ConfigError, StrictModel, apply_overrides, deep_merge, dump_yaml, load_yaml, validate
from longboat.distributed.config import ParallelConfig
from longboat.models import ModelSpec, get_model, hf_spec, model_names
from longboat.models.lora import LoRAConfig
from longboat.models.policy import lerobot_source
from longboat.recipes.lora import LoRATransform
from longboat.recipes.transforms import ModelTransform
from longboat.tasks import Task, get_task
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.utils.plugins import load_plugins


class ModelSource(BaseModel):
    """A run's ``model:`` section: an architecture (default ``decoder``) with an optional preset and any fields of its
    config, or ``hf``: a Hugging Face directory whose config.json gives the architecture and fields, and whose
    weights the run starts from, or ``lerobot``: a LeRobot policy directory, the same for a policy (its
    normalisation becomes the run's ``data.transforms`` and ``data.stats``). Fields set beside either override the
    preset's or config.json's."""

    model_config = ConfigDict(extra="allow")

    arch: str | None = None
    preset: str | None = None
    hf: str | None = None
    lerobot: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        for key in ("hf", "lerobot"):
            if getattr(self, key) is not None and (self.arch is not None or self.preset is not None):
                raise ValueError(f"model.{key} gives the architecture; drop model.arch and model.preset")
        if self.hf is not None and self.lerobot is not None:
            raise ValueError("set model.hf or model.lerobot, not both")
        return self

    @model_serializer(mode="wrap")
    def _without_unset_sources(self, handler):
        """arch, preset and hf only where set, so a saved config reads as the user wrote it."""
        return {k: v for k, v in handler(self).items()
                if v is not None or k not in ("arch", "preset", "hf", "lerobot")}

    @property
    def fields(self) -> dict:
        """The architecture config's fields set here (beside arch, preset or hf)."""
        return dict(self.model_extra or {})

    def resolve(self) -> tuple[str, dict]:
        """``(architecture, config fields)``: preset or config.json, then the fields set here."""
        if self.hf is not None:
            spec = hf_spec(self.hf)
            return spec.name, {**spec.hf.config_fields(self.hf), **self.fields}
        if self.lerobot is not None:
            arch, fields, _, _ = lerobot_source(self.lerobot)
            return arch, deep_merge(fields, self.fields)
        arch = self.arch or "decoder"
        spec = get_model(arch)
        # Nested sections merge key by key, as `inherit:` does: `model.vision.n_layers=4` keeps the preset's other
        # fields.
        return arch, deep_merge(spec.load_preset(self.preset) if self.preset else {}, self.fields)


#: The run config's sections that transform the built model, and the transform each one makes, in the order they
#: apply (``recipes/transforms.py`` applies them).
TRANSFORMS: dict[str, type[ModelTransform]] = {"lora": LoRATransform}


class RunConfig(StrictModel):
    task: str = "pretrain"
    run_dir: str = Field(description="where checkpoints, metrics, exports and the resolved config go")
    seed: int = 1234
    plugins: list[str] = Field(default_factory=list, description="modules or .py files that register tasks/models")
    model: ModelSource = Field(default_factory=lambda: ModelSource(arch="decoder", preset="tiny"),
                               description="the architecture (arch, preset, fields) or a Hugging Face directory (hf)")
    data: dict = Field(default_factory=dict)
    train: TrainerConfig
    checkpoint: CheckpointConfig = CheckpointConfig()
    parallel: ParallelConfig = ParallelConfig()
    lora: LoRAConfig | None = Field(default=None, description="train low-rank adapters on a frozen model")


@dataclass
class ResolvedRun:
    cfg: RunConfig
    arch: str
    model: StrictModel
    data: StrictModel
    task: Task

    @property
    def spec(self) -> ModelSpec:
        return get_model(self.arch)

    @property
    def source(self) -> ModelSource:
        """Where the model comes from: ``source.hf`` is the Hugging Face directory its weights start from."""
        return self.cfg.model

    @property
    def transforms(self) -> list[ModelTransform]:
        """The transforms the config asks for, in the order they apply to the built model."""
        return [make(getattr(self.cfg, key)) for key, make in TRANSFORMS.items() if getattr(self.cfg, key) is not None]

    def to_yaml(self) -> str:
        """The run config with the model preset expanded: enough to rebuild the model from a checkpoint."""
        model = ModelSource(arch=self.arch, **self.model.model_dump(mode="json"))
        return dump_yaml(self.cfg.model_copy(update={"model": model}))


def resolve(data: dict, source: str = "config", base_dir: str | Path | None = None,
            from_data: bool = True) -> ResolvedRun:
    """Validate a raw run config. ``from_data=False`` skips asking the data for model fields: a saved run's
    config already holds them, and its data may have moved since."""
    plugins = data.get("plugins") or []
    if plugins:
        data = {**data, "plugins": load_plugins(plugins if isinstance(plugins, list) else [plugins], base_dir)}
    else:
        load_plugins([])
    data = with_lerobot_normalisation(with_train_defaults(data), source)
    cfg = validate(RunConfig, data, source)
    task = get_task(cfg.task)
    task_obj = task(validate(task.data_config, cfg.data, source, prefix="data"))
    arch, fields = cfg.model.resolve()
    _check_arch_fits_task(task_obj, arch, cfg.task, source)  # the task, so it may note what the model takes
    if from_data:
        fields = task_obj.configure_model(fields)
    model_cfg = validate(get_model(arch).config, fields, source, prefix="model")
    return ResolvedRun(cfg, arch, model_cfg, task_obj.data, task_obj)


def with_lerobot_normalisation(data: dict, source: str) -> dict:
    """A run starting from a LeRobot policy (``model.lerobot``) normalises its data as the policy did: the policy's
    transforms and statistics go into ``data`` (where the user set none), and so into the saved config."""
    model, task = data.get("model"), data.get("task", RunConfig.model_fields["task"].default)
    if not isinstance(model, dict) or not isinstance(model.get("lerobot"), str):
        return data
    if task != "policy":
        raise ConfigError(f"{source}: model.lerobot is a robot policy, which task 'policy' trains, not '{task}'")
    section = data.get("data") if isinstance(data.get("data"), dict) else {}
    _, _, transforms, stats = lerobot_source(model["lerobot"])
    section = {**section, "transforms": section.get("transforms") or transforms,
               "stats": {**stats, **(section.get("stats") or {})}}
    return {**data, "data": section}


def with_train_defaults(data: dict) -> dict:
    """``data`` with its task's ``train_defaults`` merged under the user's ``train:`` (what the user sets wins; a
    section set to null, e.g. ``train.ema: null``, turns a default off)."""
    name = data.get("task", RunConfig.model_fields["task"].default)
    if not isinstance(name, str) or not isinstance(data.get("train", {}), dict):
        return data  # validation names the bad key
    defaults = get_task(name).train_defaults
    if not defaults:
        return data
    return {**data, "train": deep_merge(defaults, data.get("train") or {})}


def _check_arch_fits_task(task: Task, arch: str, task_name: str, source: str) -> None:
    task.check_architecture(get_model(arch).config)
    base = task.model_config
    if base is None or issubclass(get_model(arch).config, base):
        return
    fitting = [name for name in model_names() if issubclass(get_model(name).config, base)]
    raise ConfigError(f"{source}: model.arch '{arch}' is not a model task '{task_name}' trains (its config does not "
                      f"derive from {base.__name__}); known: {', '.join(fitting) or 'none'}")


def load_run_config(path: str | os.PathLike, overrides: list[str] = (), from_data: bool = True) -> ResolvedRun:
    """Read ``path`` (with ``inherit:``), apply ``key=value`` overrides, validate every section."""
    raw = apply_overrides(load_yaml(path), list(overrides))
    return resolve(raw, source=str(path), base_dir=Path(path).parent, from_data=from_data)


def load_run_dir_plugins(run_dir: str | os.PathLike) -> None:
    """Import the plugins a run directory's ``config.yaml`` names: the run is the user's own, as its config is."""
    path = Path(run_dir) / "config.yaml"
    plugins = load_yaml(path).get("plugins") or []
    load_plugins(plugins if isinstance(plugins, list) else [plugins], base_dir=path.parent)


def load_run_dir_config(run_dir: str | os.PathLike) -> ResolvedRun:
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
    return load_run_config(path, from_data=False)
