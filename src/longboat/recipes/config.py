"""The training run's config: one file for every task, resolved and validated before any work starts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from longboat.config.base import ConfigError, StrictModel, apply_overrides, dump_yaml, load_yaml, validate
from longboat.distributed.config import ParallelConfig
from longboat.models import get_model
from longboat.models.llm.presets import load_preset
from longboat.tasks import get_task
from longboat.trainer.config import CheckpointConfig, TrainerConfig


class RunConfig(StrictModel):
    task: str = "pretrain"
    run_dir: str = Field(description="where checkpoints, metrics, exports and the resolved config go")
    seed: int = 1234
    # Architecture name, optional preset and any field of that architecture's config; resolved below.
    model: dict = Field(default_factory=lambda: {"arch": "decoder", "preset": "tiny"})
    data: dict = Field(default_factory=dict)
    train: TrainerConfig
    checkpoint: CheckpointConfig = CheckpointConfig()
    parallel: ParallelConfig = ParallelConfig()


@dataclass
class ResolvedRun:
    cfg: RunConfig
    arch: str
    model: StrictModel
    data: StrictModel

    def to_yaml(self) -> str:
        """The run config with the model preset expanded: enough to rebuild the model from a checkpoint."""
        full = self.cfg.model_copy(update={"model": {"arch": self.arch, **self.model.model_dump(mode="json")}})
        return dump_yaml(full)


def resolve_model(spec: dict, source: str) -> tuple[str, StrictModel]:
    spec = dict(spec)
    if "hf" in spec:  # start from a Hugging Face directory: its config.json gives the architecture
        from longboat.models.llm.hf import hf_config_fields

        if "arch" in spec or "preset" in spec:
            raise ConfigError(f"{source}: model.hf gives the architecture; drop model.arch and model.preset")
        arch, fields = hf_config_fields(spec.pop("hf"))
        config_cls, _ = get_model(arch)
        return arch, validate(config_cls, {**fields, **spec}, source, prefix="model")
    arch = spec.pop("arch", "decoder")
    preset = spec.pop("preset", None)
    config_cls, _ = get_model(arch)
    fields = {**(load_preset(preset) if preset else {}), **spec}
    return arch, validate(config_cls, fields, source, prefix="model")


def resolve(data: dict, source: str = "config") -> ResolvedRun:
    cfg = validate(RunConfig, data, source)
    arch, model_cfg = resolve_model(cfg.model, source)
    task = get_task(cfg.task)
    data_cfg = validate(task.data_config, cfg.data, source, prefix="data")
    return ResolvedRun(cfg, arch, model_cfg, data_cfg)


def load_run_config(path: str | os.PathLike, overrides: list[str] = ()) -> ResolvedRun:
    """Read ``path`` (with ``inherit:``), apply ``key=value`` overrides, validate every section."""
    raw = apply_overrides(load_yaml(path), list(overrides))
    return resolve(raw, source=str(path))


def load_run_dir_config(run_dir: str | os.PathLike) -> ResolvedRun:
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
    return load_run_config(path)
