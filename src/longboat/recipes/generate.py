"""``longboat generate``: sample text from an export, a run directory or one of its checkpoints."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from longboat.checkpoint.dcp import COMPLETE_MARKER, CheckpointManager, load_model_weights
from longboat.checkpoint.export import EXPORT_CONFIG, load_export_weights, read_export_config
from longboat.config.base import ConfigError, validate
from longboat.data.tokenizer import Tokenizer
from longboat.models import get_model
from longboat.models.generation import generate
from longboat.recipes.config import load_run_dir_config


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    source: Path


def load_for_inference(path: str | Path) -> LoadedModel:
    """Accept an export dir, a run dir (its export, else its newest checkpoint) or a checkpoint dir."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such export, run directory or checkpoint")
    if (path / EXPORT_CONFIG).is_file():
        meta = read_export_config(path)
        config_cls, model_cls = get_model(meta["arch"])
        model = model_cls(validate(config_cls, meta["model"], str(path / EXPORT_CONFIG), prefix="model"))
        load_export_weights(path, model)
        return LoadedModel(model.eval(), Tokenizer(path), path)
    if (path / "export" / EXPORT_CONFIG).is_file():
        return load_for_inference(path / "export")
    if (path / COMPLETE_MARKER).is_file():  # run_dir/checkpoints/step_N
        run_dir, checkpoint = path.parent.parent, path
    elif (path / "config.yaml").is_file():
        run_dir, checkpoint = path, CheckpointManager(path / "checkpoints").latest()
        if checkpoint is None:
            raise ConfigError(f"{path}: run directory has neither an export nor a complete checkpoint")
    else:
        raise ConfigError(f"{path}: expected an export ({EXPORT_CONFIG}), a run directory or a checkpoint")
    resolved = load_run_dir_config(run_dir)
    _, model_cls = get_model(resolved.arch)
    model = model_cls(resolved.model)
    load_model_weights(checkpoint, model)
    return LoadedModel(model.eval(), Tokenizer(resolved.data.tokenizer), checkpoint)


def generate_text(
    loaded: LoadedModel,
    prompt: str,
    max_new_tokens: int = 128,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
) -> tuple[str, float]:
    """The completion of ``prompt`` and the decode rate in tokens/s."""
    tok = loaded.tokenizer
    ids = tok.encode(prompt) if prompt else []
    if not ids:
        ids = [tok.bos_id if tok.bos_id is not None else tok.eos_id]
    max_len = loaded.model.cfg.max_seq_len
    if len(ids) + max_new_tokens > max_len:
        raise ConfigError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                          f"max_seq_len {max_len}")
    prompt_t = torch.tensor([ids], dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    out = generate(loaded.model, prompt_t, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   eos_id=tok.eos_id, generator=gen)
    elapsed = time.perf_counter() - start
    new = out[0, len(ids):].tolist()
    if tok.eos_id in new:
        new = new[: new.index(tok.eos_id)]
    return tok.decode(new), len(new) / max(elapsed, 1e-9)
