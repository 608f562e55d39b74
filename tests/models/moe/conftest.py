"""Shared by the MoE tests: the sizes, transformers' modeling modules, weights drawn for a test and the
reference loop over experts the layer is compared with."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from longboat.models.moe import MoE, Routing, split_gate_up


D, FFN = 64, 32


def hf_modeling(family: str):
    """transformers' modeling module for a family; imported on use, so the other tests run without it."""
    pytest.importorskip("transformers")
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def randomize(module: nn.Module, router_std: float = 1.0) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(std=router_std if name.startswith("gate.") else 0.1)


def reference_routed(layer: MoE, x: torch.Tensor, routing: Routing, keep: torch.Tensor | None = None):
    """One expert at a time with index_select: the plainest statement of what the layer computes."""
    (w1, w3), w2 = split_gate_up(layer.experts.w13), layer.experts.w2
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in range(layer.cfg.n_experts):
        hit = routing.indices == e
        if keep is not None:
            hit = hit & keep
        token, choice = hit.nonzero(as_tuple=True)
        xe = x.index_select(0, token)
        y = (F.silu(xe @ w1[e].T) * (xe @ w3[e].T)) @ w2[e].T
        out = out.index_add(0, token, y.float() * routing.weights[token, choice].unsqueeze(-1))
    return out.to(x.dtype)
