"""A pipeline as files an export carries: its config as JSON and the statistics it read as safetensors, from
which a served policy rebuilds exactly the pipeline it was trained with. Never a pickle."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load, save

from longboat.config.base import ConfigError
from longboat.data.robot.transforms.pipeline import Pipeline

TRANSFORMS_CONFIG = "transforms.json"
TRANSFORMS_STATS = "transforms.safetensors"
FORMAT_VERSION = 1


def pipeline_assets(pipeline: Pipeline) -> dict[str, bytes]:
    """File name -> bytes, the shape of ``Task.export_assets``."""
    config = {"format_version": FORMAT_VERSION, "transforms": pipeline.to_dict()}
    return {TRANSFORMS_CONFIG: (json.dumps(config, indent=2) + "\n").encode(),
            TRANSFORMS_STATS: save(pipeline.state_dict(), metadata={"format": "pt"})}


def load_pipeline(directory: str | os.PathLike, *, seed: int = 0, train: bool = False) -> Pipeline:
    """The pipeline ``pipeline_assets`` wrote into ``directory``, in evaluation mode unless ``train``."""
    config_path, stats_path = Path(directory) / TRANSFORMS_CONFIG, Path(directory) / TRANSFORMS_STATS
    for path in (config_path, stats_path):
        if not path.is_file():
            raise ConfigError(f"{directory}: no {path.name}; the export carries no transform pipeline")
    return pipeline_from_assets(config_path.read_bytes(), stats_path.read_bytes(), str(config_path), seed=seed,
                                train=train)


def pipeline_from_assets(config: bytes, stats: bytes, source: str, *, seed: int = 0, train: bool = False) -> Pipeline:
    """The pipeline from the two assets' bytes (a checkpoint's task state holds them as bytes)."""
    try:
        spec = json.loads(config)
    except ValueError as e:
        raise ConfigError(f"{source}: not valid JSON ({e})") from None
    if not isinstance(spec, dict) or spec.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"{source}: not a transform list of format {FORMAT_VERSION}")
    try:
        state_dict = load(stats)
    except SafetensorError as e:
        raise ConfigError(f"{source}: {TRANSFORMS_STATS}: not a readable safetensors file ({e})") from None
    return Pipeline.from_state_dict(spec.get("transforms"), state_dict, source=source, seed=seed, train=train)
