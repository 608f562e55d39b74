"""Seeding and RNG state capture, so a resumed run continues the same random streams."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every RNG the training loop may touch, in types ``torch.load(weights_only=True)`` accepts."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    acc = _accelerator_module()
    if acc is not None:
        state["accelerator"] = acc.get_rng_state_all()
    return state


def _accelerator_module():
    """torch.cuda, torch.xpu, ... when this process has initialised an accelerator with its own RNG."""
    if not torch.accelerator.is_available():
        return None
    module = torch.get_device_module(torch.accelerator.current_accelerator())
    initialised = getattr(module, "is_initialized", lambda: True)()
    return module if initialised and hasattr(module, "get_rng_state_all") else None


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, *tail = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *tail))
    torch.set_rng_state(state["torch"])
    saved = state.get("accelerator", state.get("cuda"))  # "cuda": checkpoints of format 1
    acc = _accelerator_module()
    if saved is not None and acc is not None:
        acc.set_rng_state_all(saved)
