"""``longboat export``: a safetensors export from a run directory (its newest checkpoint) or a checkpoint."""

from __future__ import annotations

from pathlib import Path

from longboat.checkpoint.export import save_export
from longboat.recipes.artifact import export_metadata, open_artifact


def export_run(source: str | Path, output: str | Path) -> Path:
    artifact = open_artifact(source, prefer_checkpoint=True)
    return save_export(
        output, artifact.model, artifact.arch, artifact.config.model_dump(mode="json"), artifact.assets,
        extra={**export_metadata(artifact.task, artifact.plugins, artifact.ema), "checkpoint": str(artifact.source)},
    )
