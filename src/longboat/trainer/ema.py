"""An exponential moving average of the trainable weights, kept in fp32 beside the model.

Each EMA tensor mirrors its parameter's layout: a full tensor in one process or under DDP, a DTensor shard
under FSDP2 or tensor parallel, so every rank averages only what it holds and checkpoints reshard it like the
parameters. ``swapped_in`` puts the average into the model for evaluation and export, then restores it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from longboat.distributed.names import plain_name
from longboat.trainer.config import EMAConfig


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class EMA:
    def __init__(self, model: nn.Module, cfg: EMAConfig):
        self.cfg = cfg
        self._params: dict[str, nn.Parameter] = {}
        seen: set[int] = set()
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self._params[plain_name(name)] = p
        with torch.no_grad():
            self.shadow = {n: p.detach().to(torch.float32, copy=True) for n, p in self._params.items()}

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold the weights after optimizer step ``step`` (1-based) into the average."""
        if step % self.cfg.every:
            return
        weight = 1.0 if step <= self.cfg.warmup_steps else 1.0 - self.cfg.decay
        shadow = [_local(self.shadow[n]) for n in self._params]
        current = [_local(p.detach()).to(torch.float32) for p in self._params.values()]
        torch._foreach_lerp_(shadow, current, weight)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, value in state.items():
                self.shadow[name].copy_(value)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block and its own weights again after it."""
        saved = {n: _local(p.detach()).clone() for n, p in self._params.items()}
        with torch.no_grad():
            for n, p in self._params.items():
                _local(p.detach()).copy_(_local(self.shadow[n]))
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in self._params.items():
                    _local(p.detach()).copy_(saved[n])
