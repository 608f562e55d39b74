"""``longboat convert``: Hugging Face checkpoint directories to longboat exports and back."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors import safe_open

from longboat.checkpoint.export import EXPORT_CONFIG, WEIGHTS, load_export_weights, read_export_config, save_export
from longboat.config.base import validate
from longboat.models import get_model
from longboat.models.llm.hf import SIDE_FILES, get_hf_adapter, infer_family, load_hf_model, save_hf_model


def hf_to_longboat(hf_dir: str | Path, output: str | Path, dtype: str | None = None) -> Path:
    """Write our export of an HF checkpoint; tokenizer files and generation_config.json come along."""
    model, cfg, family = load_hf_model(hf_dir, dtype)
    out = save_export(output, model, get_hf_adapter(family).arch, cfg.model_dump(mode="json"), hf_dir,
                      extra={"hf_family": family, "source": str(hf_dir)})
    for name in SIDE_FILES:
        if (Path(hf_dir) / name).is_file() and not (out / name).is_file():
            shutil.copy2(Path(hf_dir) / name, out / name)
    return out


def longboat_to_hf(
    source: str | Path, output: str | Path, family: str | None = None, dtype: str | None = None,
    max_shard_size: int | str = "5GB",
) -> Path:
    """Write an HF directory from an export, a run directory or a checkpoint.

    The family defaults to the one the export was converted from, else the one the model's config implies.
    """
    model, tokenizer_dir, recorded = _load(Path(source))
    family = family or recorded or infer_family(model.cfg)
    return save_hf_model(model, family, output, dtype=dtype, tokenizer_dir=tokenizer_dir,
                         max_shard_size=max_shard_size)


def _load(source: Path) -> tuple[torch.nn.Module, Path | None, str | None]:
    """``(model, directory holding its tokenizer, HF family recorded in the export)``."""
    export = source if (source / EXPORT_CONFIG).is_file() else source / "export"
    if (export / EXPORT_CONFIG).is_file():
        meta = read_export_config(export)
        config_cls, model_cls = get_model(meta["arch"])
        model = model_cls(validate(config_cls, meta["model"], str(export / EXPORT_CONFIG), prefix="model"))
        load_export_weights(export, model)
        with safe_open(str(export / WEIGHTS), framework="pt") as f:  # keep the stored dtype
            dtype = f.get_tensor(next(iter(f.keys()))).dtype
        return model.to(dtype).eval(), export, meta.get("hf_family")
    from longboat.recipes.generate import load_for_inference

    loaded = load_for_inference(source)
    return loaded.model, Path(loaded.tokenizer.source), None
