"""``longboat generate``: sample text from an export, a run directory or one of its checkpoints."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from longboat.config.base import ConfigError
from longboat.data.tokenizer import TOKENIZER_FILE, Tokenizer
from longboat.models.llm.generation import generate
from longboat.recipes.artifact import open_artifact


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    source: Path


def load_for_inference(path: str | Path) -> LoadedModel:
    """A language model and its tokenizer from an export, a run directory or a checkpoint."""
    artifact = open_artifact(path)
    return LoadedModel(artifact.model, Tokenizer(artifact.asset_file(TOKENIZER_FILE).parent), artifact.source)


def check_sampling(
    max_new_tokens: int = 128,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    num_samples: int = 1,
) -> None:
    """Refuse sampling settings outside their range, before any model is loaded."""
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"temperature must be 0 (greedy) or positive, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k must be at least 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
    if num_samples < 1:
        raise ConfigError(f"num_samples must be at least 1, got {num_samples}")


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
    check_sampling(max_new_tokens, temperature, top_k, top_p)
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
