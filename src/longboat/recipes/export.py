"""``longboat export``: a safetensors export from a run directory (its newest checkpoint) or a checkpoint."""

from __future__ import annotations

from pathlib import Path

from longboat.checkpoint.export import save_export
from longboat.recipes.artifact import Artifact, export_metadata, open_artifact
from longboat.utils.outputs import check_output


def export_run(source: str | Path, output: str | Path, overwrite: bool = False) -> Path:
    """Write the export; an existing ``output`` is replaced only with ``overwrite``, and never what is read."""
    check_output(output, overwrite, [source])  # before the model is read, which may take long
    artifact = open_artifact(source, prefer_checkpoint=True)
    return save_export(
        output, artifact.model, artifact.arch, artifact.config.model_dump(mode="json"), artifact.assets,
        extra={**export_metadata(artifact.task, artifact.plugins, artifact.ema, artifact.folded),
               "checkpoint": str(artifact.source)},
        overwrite=overwrite, sources=read_paths(source, artifact),
    )


def read_paths(source: str | Path, artifact: Artifact) -> list[Path]:
    """Everything a command reads from an artifact: the path given, the directory opened, its asset files."""
    return [Path(source), artifact.source, *(p for p in artifact.assets.values() if isinstance(p, Path))]
