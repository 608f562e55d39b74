"""``longboat export``: a safetensors export from a run directory or one of its checkpoints."""

from __future__ import annotations

from pathlib import Path

from longboat.checkpoint.dcp import COMPLETE_MARKER, CheckpointManager, load_model_weights
from longboat.checkpoint.export import save_export
from longboat.config.base import ConfigError
from longboat.models import get_model
from longboat.recipes.config import load_run_dir_config


def export_run(source: str | Path, output: str | Path) -> Path:
    source = Path(source)
    if (source / COMPLETE_MARKER).is_file():
        run_dir, checkpoint = source.parent.parent, source
    else:
        run_dir, checkpoint = source, CheckpointManager(source / "checkpoints").latest()
        if checkpoint is None:
            raise ConfigError(f"{source}: no complete checkpoint to export")
    resolved = load_run_dir_config(run_dir)
    _, model_cls = get_model(resolved.arch)
    model = model_cls(resolved.model)
    load_model_weights(checkpoint, model)
    tokenizer = getattr(resolved.data, "tokenizer", None)
    return save_export(output, model, resolved.arch, resolved.model.model_dump(mode="json"), tokenizer,
                       extra={"checkpoint": str(checkpoint)})
