"""LoRA: low-rank adapters on a model's ``nn.Linear`` layers, for any registered architecture.

``apply_lora`` replaces each targeted linear layer by a ``LoRALinear`` that keeps the base ``weight`` and
``bias`` under their names (base state dicts and HF weights load unchanged) and adds ``lora_A`` [rank, in] and
``lora_B`` [out, rank]: y = W x + b + scale · B A dropout(x). A starts kaiming-uniform and B at zero, as PEFT
does, so the adapted model computes exactly the base function until it trains. ``merge_lora`` folds the
product into the base weights and gives back plain ``nn.Linear`` layers (the same ``merged_state_dict`` does for
a state dict gathered from shards). Grouped expert weights of MoE layers and embeddings are not ``nn.Linear``
and cannot be targets.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from longboat.config.base import ConfigError, StrictModel

DEFAULT_TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
LORA_PARAMS = ("lora_A", "lora_B")


class LoRAConfig(StrictModel):
    rank: int = Field(default=8, gt=0)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1, description="on the adapter's input only")
    targets: list[str] | None = Field(
        default=None, min_length=1,
        description="module-name suffixes of the nn.Linear layers to adapt (e.g. wq, wv, feed_forward.w1); "
                    "default: the attention and MLP projections wq wk wv wo w1 w2 w3 the model has")
    rslora: bool = Field(default=False, description="scale by alpha/sqrt(rank) instead of alpha/rank")

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


class LoRALinear(nn.Linear):
    """``nn.Linear`` plus a low-rank update; ``weight`` and ``bias`` are the base layer's own parameters."""

    def __init__(self, base: nn.Linear, rank: int, scale: float, dropout: float):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.scale, self.dropout = scale, dropout
        self.adapter_enabled = True  # off: the base layer alone (e.g. the reference of preference tuning)
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **kw))
        self.lora_B = nn.Parameter(torch.empty(base.out_features, rank, **kw))
        if not self.lora_A.is_meta:
            self.init_adapter_weights()

    @torch.no_grad()
    def init_adapter_weights(self) -> None:
        """PEFT's initialisation: the update B·A starts at zero. (``materialize`` calls it after meta init.)"""
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.adapter_enabled:
            return F.linear(x, self.weight, self.bias)
        update = F.linear(F.linear(F.dropout(x, self.dropout, self.training), self.lora_A), self.lora_B)
        return F.linear(x, self.weight, self.bias) + update * self.scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.lora_A.shape[0]}, scale={self.scale:g}"


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[int]:
    """Run ``model`` as its base within the block: every adapter off (yields how many); on again after."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for layer in layers:
        layer.adapter_enabled = False
    try:
        yield len(layers)
    finally:
        for layer in layers:
            layer.adapter_enabled = True


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def apply_lora(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """Put adapters on every ``nn.Linear`` a target names (in place); returns the adapted module names.

    A target that names no linear layer is an error listing the suffixes that do.
    """
    linears = {n: m for n, m in model.named_modules()
               if n and isinstance(m, nn.Linear) and not isinstance(m, LoRALinear)}
    others = {n: type(m).__name__ for n, m in model.named_modules() if n and n not in linears}
    targets = list(cfg.targets or DEFAULT_TARGETS)
    chosen: set[str] = set()
    for target in targets:
        found = [n for n in linears if _matches(n, target)]
        if not found and cfg.targets is not None:
            raise ConfigError(_no_match(target, linears, others))
        chosen.update(found)
    if not chosen:
        raise ConfigError(f"lora.targets: none of the default targets {', '.join(targets)} names an nn.Linear of "
                          f"{type(model).__name__}; set lora.targets (linear layers end in: {_suffixes(linears)})")
    adapted = [n for n in linears if n in chosen]  # in module order, as meta initialisation visits them
    for name in adapted:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, LoRALinear(linears[name], cfg.rank, cfg.scale, cfg.dropout))
    return adapted


def _suffixes(linears: dict[str, nn.Module]) -> str:
    return ", ".join(sorted({n.rpartition(".")[2] for n in linears})) or "none"


def _no_match(target: str, linears: dict[str, nn.Module], others: dict[str, str]) -> str:
    kinds = sorted({kind for n, kind in others.items() if _matches(n, target)})
    what = f"names {', '.join(kinds)} modules, not nn.Linear" if kinds else "matches no module"
    return (f"lora.targets: '{target}' {what}; LoRA adapts nn.Linear layers, whose names end in: "
            f"{_suffixes(linears)} (embeddings and the grouped experts of MoE layers cannot be targets)")


def is_lora_name(name: str) -> bool:
    """Whether a parameter or state-dict name is an adapter's."""
    return name.rpartition(".")[2] in LORA_PARAMS


def _delta(a: torch.Tensor, b: torch.Tensor, scale: float, like: torch.Tensor) -> torch.Tensor:
    """scale · B A, computed in fp32 and returned in the base weight's dtype and device."""
    return (scale * (b.float() @ a.float())).to(like.device, like.dtype)


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight and put a plain ``nn.Linear`` in its place (in place)."""
    for name, module in list(model.named_modules()):
        if not isinstance(module, LoRALinear):
            continue
        plain = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
        plain.weight, plain.bias = module.weight, module.bias
        plain.weight.add_(_delta(module.lora_A, module.lora_B, module.scale, plain.weight))
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, plain)
    return model


def merged_state_dict(state: dict[str, torch.Tensor], cfg: LoRAConfig) -> dict[str, torch.Tensor]:
    """A full state dict with every adapter folded into its base weight and the adapter tensors gone."""
    out = {k: v for k, v in state.items() if not is_lora_name(k)}
    for key in state:
        if key.endswith(".lora_A"):
            module = key.removesuffix(".lora_A")
            weight = out[f"{module}.weight"]
            out[f"{module}.weight"] = weight + _delta(state[key], state[f"{module}.lora_B"], cfg.scale, weight)
    return out
