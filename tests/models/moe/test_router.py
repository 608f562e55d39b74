"""The router: ERNIE-4.5's lower bound on the top-k normaliser."""

from __future__ import annotations

import torch

from longboat.models.moe import MoE, MoEConfig


def test_topk_norm_min_bounds_the_normaliser():
    """ERNIE-4.5 divides by max(sum, norm_min): a bias can choose experts whose probabilities sum below it."""
    cfg = MoEConfig(d_model=4, n_experts=4, top_k=2, expert_ffn_dim=8, use_expert_bias=True, topk_norm_min=0.5)
    layer = MoE(cfg)
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(4) * 10)
        layer.router.expert_bias.copy_(torch.tensor([0.0, 0.0, 5.0, 5.0]))  # selection goes to experts 2 and 3
    x = torch.tensor([[1.0, 0, 0, 0], [0, 0, 1.0, 0]])
    routing = layer.router(x)
    assert routing.indices.sort(dim=-1).values.tolist() == [[2, 3], [2, 3]]
    chosen = routing.scores.gather(1, routing.indices)
    torch.testing.assert_close(routing.weights[0], chosen[0] / 0.5)  # sum ~1e-4: the bound binds
    torch.testing.assert_close(routing.weights[1], chosen[1] / chosen[1].sum())  # sum ~1: it does not
