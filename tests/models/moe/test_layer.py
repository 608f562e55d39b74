"""MoE layer: parity with transformers' MoE blocks, capacity drops, and the expert-bias balancing rule, on one
rank and summed over ranks."""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from longboat.models.moe import MoE, MoEConfig, fuse_gate_up
from tests.models.moe.conftest import D, FFN, hf_modeling, randomize, reference_routed


def _hf_config(cls, **kw):
    cfg = cls(**kw)
    cfg._experts_implementation = "eager"  # the per-expert loop, as written in the modeling file
    return cfg


@torch.no_grad()
def _load_from_hf(ours: MoE, hf_block: nn.Module) -> None:
    """Copy a transformers MoE block's weights into ours (gate_up_proj's halves -> w13's gate and up)."""
    ours.router.weight.copy_(hf_block.gate.weight)
    ours.experts.w13.copy_(fuse_gate_up(*hf_block.experts.gate_up_proj.chunk(2, dim=1)))
    ours.experts.w2.copy_(hf_block.experts.down_proj)
    if getattr(hf_block.gate, "e_score_correction_bias", None) is not None:
        ours.router.expert_bias.copy_(hf_block.gate.e_score_correction_bias)
    shared = getattr(hf_block, "shared_experts", None) or getattr(hf_block, "shared_expert", None)
    if shared is not None:
        ours.shared_experts.w1.weight.copy_(shared.gate_proj.weight)
        ours.shared_experts.w3.weight.copy_(shared.up_proj.weight)
        ours.shared_experts.w2.weight.copy_(shared.down_proj.weight)
    if getattr(hf_block, "shared_expert_gate", None) is not None:
        ours.shared_gate.weight.copy_(hf_block.shared_expert_gate.weight)


def _by_index(indices, weights):
    """Sort each token's choices by expert id, so routers that return top-k unsorted compare equal."""
    indices, perm = indices.sort(dim=-1)
    return indices, weights.gather(1, perm)


def _check_parity(ours: MoE, hf_block: nn.Module, x: torch.Tensor, sort_choices: bool = False) -> None:
    with torch.no_grad():
        _, hf_weights, hf_indices = hf_block.gate(x.view(-1, D))
        hf_out = hf_block(x.clone())
        routing = ours.router(x.view(-1, D))
        out, _ = ours(x)
    ours_idx, ours_w, hf_w = routing.indices, routing.weights, hf_weights.float()
    if sort_choices:
        ours_idx, ours_w = _by_index(ours_idx, ours_w)
        hf_indices, hf_w = _by_index(hf_indices, hf_w)
    assert torch.equal(ours_idx, hf_indices)
    torch.testing.assert_close(ours_w, hf_w, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out, hf_out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_matches_qwen3_moe_block(norm_topk_prob):
    hf_cfg = _hf_config(
        hf_modeling("qwen3_moe").Qwen3MoeConfig, hidden_size=D, moe_intermediate_size=FFN, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
    )
    hf_block = hf_modeling("qwen3_moe").Qwen3MoeSparseMoeBlock(hf_cfg).eval()
    randomize(hf_block)
    ours = MoE(MoEConfig(d_model=D, n_experts=8, top_k=2, expert_ffn_dim=FFN, norm_topk_prob=norm_topk_prob))
    _load_from_hf(ours, hf_block)
    _check_parity(ours, hf_block, torch.randn(2, 24, D))


def test_matches_mixtral_block():
    hf_cfg = _hf_config(
        hf_modeling("mixtral").MixtralConfig, hidden_size=D, intermediate_size=FFN, num_local_experts=8, num_experts_per_tok=2
    )
    hf_block = hf_modeling("mixtral").MixtralSparseMoeBlock(hf_cfg).eval()
    randomize(hf_block)
    ours = MoE(MoEConfig(d_model=D, n_experts=8, top_k=2, expert_ffn_dim=FFN, norm_topk_prob=True))
    _load_from_hf(ours, hf_block)
    _check_parity(ours, hf_block, torch.randn(2, 24, D))


def test_matches_qwen2_moe_block_with_gated_shared_expert():
    hf_cfg = _hf_config(
        hf_modeling("qwen2_moe").Qwen2MoeConfig, hidden_size=D, moe_intermediate_size=FFN, shared_expert_intermediate_size=48,
        num_experts=8, num_experts_per_tok=4, norm_topk_prob=False,
    )
    hf_block = hf_modeling("qwen2_moe").Qwen2MoeSparseMoeBlock(hf_cfg).eval()
    randomize(hf_block)
    ours = MoE(MoEConfig(
        d_model=D, n_experts=8, top_k=4, expert_ffn_dim=FFN, norm_topk_prob=False,
        n_shared_experts=1, shared_ffn_dim=48, shared_expert_gate=True,
    ))
    _load_from_hf(ours, hf_block)
    _check_parity(ours, hf_block, torch.randn(2, 24, D))


def test_matches_deepseek_v3_moe():
    hf_cfg = _hf_config(
        hf_modeling("deepseek_v3").DeepseekV3Config, hidden_size=D, moe_intermediate_size=FFN, n_routed_experts=16,
        num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=2, routed_scaling_factor=2.5,
        norm_topk_prob=True,
    )
    hf_block = hf_modeling("deepseek_v3").DeepseekV3MoE(hf_cfg).eval()
    randomize(hf_block, router_std=0.3)
    with torch.no_grad():
        hf_block.gate.e_score_correction_bias.normal_(std=0.1)
    ours = MoE(MoEConfig(
        d_model=D, n_experts=16, top_k=4, expert_ffn_dim=FFN, n_shared_experts=2, score_func="sigmoid",
        norm_topk_prob=True, routed_scaling_factor=2.5, n_groups=4, topk_groups=2, use_expert_bias=True,
    ))
    _load_from_hf(ours, hf_block)
    x = torch.randn(2, 24, D)
    _check_parity(ours, hf_block, x, sort_choices=True)

    # Group limit: every token's experts come from at most topk_groups groups.
    routing = ours.router(x.view(-1, D))
    groups = routing.indices // 4
    assert max(len(set(row.tolist())) for row in groups) <= 2


def test_capacity_drops_later_tokens_and_reports_counts():
    n_exp, top_k, n_tok = 4, 2, 16
    cfg = MoEConfig(d_model=D, n_experts=n_exp, top_k=top_k, expert_ffn_dim=FFN, capacity_factor=1.0)
    layer = MoE(cfg)
    layer.init_weights(std=0.1)
    with torch.no_grad():
        # Feature 0 is large and positive for every token and pulls it towards experts 0 and 1.
        layer.router.weight[:, 0] = torch.tensor([4.0, 3.0, 0.0, 0.0])
    x = torch.randn(n_tok, D)
    x[:, 0] = 3.0
    y, aux = layer(x)
    routing = layer.router(x)
    capacity = math.ceil(1.0 * n_tok * top_k / n_exp)
    assert layer.capacity(n_tok) == capacity == 8

    # Each expert keeps its first `capacity` copies, walking tokens in order.
    keep = torch.zeros_like(routing.indices, dtype=torch.bool)
    taken = [0] * n_exp
    for t in range(n_tok):
        for j in range(top_k):
            e = routing.indices[t, j].item()
            keep[t, j] = taken[e] < capacity
            taken[e] += 1
    load = torch.bincount(routing.indices.flatten(), minlength=n_exp).float()
    assert load.max() > capacity  # the test routes enough tokens to overflow
    assert torch.equal(aux["load"], load)
    assert torch.equal(aux["dropped"], (load - load.clamp(max=capacity)))
    assert aux["dropped"].sum() == (~keep).sum()
    assert keep[:8].all() and not keep[8:].all()  # the drops fall on the later tokens
    torch.testing.assert_close(y, reference_routed(layer, x, routing, keep), atol=1e-5, rtol=1e-5)

    # Same drops on the padded fallback, and no gradient garbage from the skipped rows.
    padded = MoE(cfg.model_copy(update={"experts_impl": "padded"}))
    padded.load_state_dict(layer.state_dict())
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, _ = layer(xa)
    yb, _ = padded(xb)
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    ya.sum().backward()
    yb.sum().backward()
    assert torch.isfinite(xa.grad).all()
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=1e-5)


def test_expert_bias_update_rule_and_weights_ignore_bias():
    cfg = MoEConfig(d_model=D, n_experts=4, top_k=2, expert_ffn_dim=FFN, score_func="sigmoid", use_expert_bias=True,
                    bias_update_rate=0.01)
    layer = MoE(cfg)
    load = torch.tensor([10.0, 2.0, 4.0, 0.0])  # mean 4
    layer.update_expert_bias(load)
    torch.testing.assert_close(layer.router.expert_bias, torch.tensor([-0.01, 0.01, 0.0, 0.01]))
    assert not layer.router.expert_bias.requires_grad
    assert "router.expert_bias" in layer.state_dict()

    # Selection follows the bias, weights do not include it.
    x = torch.randn(8, D)
    with torch.no_grad():
        layer.router.expert_bias.copy_(torch.tensor([0.0, 0.0, 10.0, 10.0]))
    routing = layer.router(x)
    assert torch.equal(routing.indices.sort(dim=-1).values, torch.tensor([[2, 3]] * 8))
    expected = routing.scores.gather(1, routing.indices)
    torch.testing.assert_close(routing.weights, expected / expected.sum(dim=-1, keepdim=True))

    # A bf16 cast leaves the bias in fp32, where a 0.01 step on 10 is not rounded away.
    layer.to(torch.bfloat16)
    assert layer.router.expert_bias.dtype == torch.float32
    layer.update_expert_bias(torch.tensor([1.0, 1.0, 0.0, 2.0]))
    torch.testing.assert_close(layer.router.expert_bias, torch.tensor([0.0, 0.0, 10.01, 9.99]))
    layer.float()

    # forward leaves the count alone; the caller records each training forward's loads, the update clears them.
    layer.train()
    _, aux = layer(x)
    assert layer.load_since_update.sum() == 0
    layer.record_load(aux["load"])
    layer.record_load(layer(x)[1]["load"])
    assert torch.equal(layer.load_since_update, 2 * aux["load"].long()) and layer.load_since_update.sum() == 2 * 8 * 2
    layer.update_expert_bias()
    assert layer.load_since_update.sum() == 0


def test_expert_bias_balances_a_skewed_router():
    n_exp = 8
    cfg = MoEConfig(d_model=D, n_experts=n_exp, top_k=2, expert_ffn_dim=FFN, score_func="sigmoid",
                    use_expert_bias=True, bias_update_rate=1e-3)
    torch.manual_seed(0)
    layer = MoE(cfg)
    with torch.no_grad():
        layer.router.weight.normal_(std=0.05)
        layer.router.weight[:, 0] = torch.linspace(0.5, -0.5, n_exp)  # favours the first experts
    x = torch.randn(512, D)
    x[:, 0] = 1.0

    def ratio() -> float:
        load = torch.bincount(layer.router(x).indices.flatten(), minlength=n_exp).float()
        return (load.max() / load.min()).item()

    before = ratio()
    layer.train()
    with torch.no_grad():
        for _ in range(300):
            load = torch.bincount(layer.router(x).indices.flatten(), minlength=n_exp)
            layer.update_expert_bias(load)
    after = ratio()
    print(f"max/min expert load: {before:.1f} -> {after:.2f}")
    assert before > 4
    assert after <= before / 2, (before, after)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bias_update_worker(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        layer = MoE(MoEConfig(d_model=8, n_experts=4, top_k=1, expert_ffn_dim=8, use_expert_bias=True,
                              bias_update_rate=0.1))
        # Rank 0 sees [6, 0, 0, 0] and rank 1 [0, 0, 1, 5]: summed [6, 0, 1, 5], mean 3.
        load = torch.tensor([6.0, 0.0, 0.0, 0.0]) if rank == 0 else torch.tensor([0.0, 0.0, 1.0, 5.0])
        layer.update_expert_bias(load)
        out[rank] = layer.router.expert_bias.tolist()
    finally:
        dist.destroy_process_group()


def test_expert_bias_update_sums_loads_over_ranks():
    with mp.Manager() as manager:
        out = manager.dict()
        # fork, not spawn: the workers only touch tiny tensors, and re-importing torch costs seconds.
        mp.start_processes(_bias_update_worker, args=(2, _free_port(), out), nprocs=2, start_method="fork")
        results = dict(out)
    assert results[0] == results[1] == pytest.approx([-0.1, 0.1, 0.1, -0.1])
