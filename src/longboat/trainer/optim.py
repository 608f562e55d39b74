"""AdamW with decay only on matrices: norms, biases and embeddings are not decayed."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from longboat.config.base import StrictModel


class OptimizerConfig(StrictModel):
    lr: float = 3e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    # "foreach" is fastest on CPU and GPU for small models; "fused" on GPU for large ones.
    implementation: Literal["auto", "foreach", "fused", "for_loop"] = "auto"


def _decays(name: str, param: nn.Parameter, embedding_names: set[str]) -> bool:
    return param.ndim >= 2 and name not in embedding_names


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split parameters into decayed (weight matrices) and undecayed (norms, biases, embeddings)."""
    embedding_names = {
        f"{mod_name}.weight" if mod_name else "weight"
        for mod_name, mod in model.named_modules()
        if isinstance(mod, nn.Embedding)
    }
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if _decays(name, p, embedding_names) else no_decay).append(p)
    # A weight tied to an embedding is reached first through the embedding: it stays undecayed.
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    kwargs: dict = {}
    if cfg.implementation == "foreach":
        kwargs["foreach"] = True
    elif cfg.implementation == "fused":
        kwargs["fused"] = True
    elif cfg.implementation == "for_loop":
        kwargs["foreach"] = False
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kwargs
    )
