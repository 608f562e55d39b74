"""MoE layer: parity with transformers' MoE blocks, grouped == reference loop, losses, capacity, bias balancing."""

from __future__ import annotations

import importlib
import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import longboat.models.moe.experts as experts_module
from longboat.config.base import ConfigError, validate
from longboat.models.moe import GroupedExperts, MoE, MoEConfig, Routing, fuse_gate_up, split_gate_up
from longboat.models.moe.experts import swiglu
from longboat.models.moe.permute import invert_permutation, permute_rows, sum_copies

D, FFN = 64, 32


def _hf(family: str):
    """transformers' modeling module for a family; imported on use, so the other tests run without it."""
    pytest.importorskip("transformers")
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def _hf_config(cls, **kw):
    cfg = cls(**kw)
    cfg._experts_implementation = "eager"  # the per-expert loop, as written in the modeling file
    return cfg


def _randomize(module: nn.Module, router_std: float = 1.0) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(std=router_std if name.startswith("gate.") else 0.1)


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
        _hf("qwen3_moe").Qwen3MoeConfig, hidden_size=D, moe_intermediate_size=FFN, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
    )
    hf_block = _hf("qwen3_moe").Qwen3MoeSparseMoeBlock(hf_cfg).eval()
    _randomize(hf_block)
    ours = MoE(MoEConfig(d_model=D, n_experts=8, top_k=2, expert_ffn_dim=FFN, norm_topk_prob=norm_topk_prob))
    _load_from_hf(ours, hf_block)
    _check_parity(ours, hf_block, torch.randn(2, 24, D))


def test_matches_mixtral_block():
    hf_cfg = _hf_config(
        _hf("mixtral").MixtralConfig, hidden_size=D, intermediate_size=FFN, num_local_experts=8, num_experts_per_tok=2
    )
    hf_block = _hf("mixtral").MixtralSparseMoeBlock(hf_cfg).eval()
    _randomize(hf_block)
    ours = MoE(MoEConfig(d_model=D, n_experts=8, top_k=2, expert_ffn_dim=FFN, norm_topk_prob=True))
    _load_from_hf(ours, hf_block)
    _check_parity(ours, hf_block, torch.randn(2, 24, D))


def test_matches_qwen2_moe_block_with_gated_shared_expert():
    hf_cfg = _hf_config(
        _hf("qwen2_moe").Qwen2MoeConfig, hidden_size=D, moe_intermediate_size=FFN, shared_expert_intermediate_size=48,
        num_experts=8, num_experts_per_tok=4, norm_topk_prob=False,
    )
    hf_block = _hf("qwen2_moe").Qwen2MoeSparseMoeBlock(hf_cfg).eval()
    _randomize(hf_block)
    ours = MoE(MoEConfig(
        d_model=D, n_experts=8, top_k=4, expert_ffn_dim=FFN, norm_topk_prob=False,
        n_shared_experts=1, shared_ffn_dim=48, shared_expert_gate=True,
    ))
    _load_from_hf(ours, hf_block)
    _check_parity(ours, hf_block, torch.randn(2, 24, D))


def test_matches_deepseek_v3_moe():
    hf_cfg = _hf_config(
        _hf("deepseek_v3").DeepseekV3Config, hidden_size=D, moe_intermediate_size=FFN, n_routed_experts=16,
        num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=2, routed_scaling_factor=2.5,
        norm_topk_prob=True,
    )
    hf_block = _hf("deepseek_v3").DeepseekV3MoE(hf_cfg).eval()
    _randomize(hf_block, router_std=0.3)
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


def test_switch_loss_matches_transformers():
    ours = MoE(MoEConfig(d_model=D, n_experts=8, top_k=2, expert_ffn_dim=FFN, aux_loss="switch", aux_loss_coef=0.02))
    _randomize(ours, router_std=1.0)
    x = torch.randn(3, 20, D)
    _, aux = ours(x)
    routing = ours.router(x.view(-1, D))
    expected = _hf("qwen3_moe").load_balancing_loss_func((routing.logits,), 8, 2)
    torch.testing.assert_close(aux["balance_loss"], expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(aux["loss"], 0.02 * expected)
    expected_mixtral = _hf("mixtral").load_balancing_loss_func((routing.logits,), 8, 2)
    torch.testing.assert_close(aux["balance_loss"], expected_mixtral, atol=1e-6, rtol=1e-6)


def test_sequence_loss_and_z_loss_follow_published_formulas():
    n_exp, top_k, batch, seq = 8, 3, 2, 10
    ours = MoE(MoEConfig(
        d_model=D, n_experts=n_exp, top_k=top_k, expert_ffn_dim=FFN, score_func="sigmoid",
        aux_loss="sequence", aux_loss_coef=1e-3, z_loss_coef=1e-2,
    ))
    _randomize(ours)
    x = torch.randn(batch, seq, D)
    _, aux = ours(x)
    routing = ours.router(x.view(-1, D))
    scores = routing.scores.view(batch, seq, n_exp)
    chosen = routing.indices.view(batch, seq, top_k)

    # DeepSeek-V3 eqs. 17-20: s' = s / sum_j s_j;  f_i = E/(K T) * sum_t 1[i in top-k_t];  P_i = mean_t s'_i,t.
    per_seq = []
    for b in range(batch):
        norm = scores[b] / scores[b].sum(dim=-1, keepdim=True)
        total = 0.0
        for i in range(n_exp):
            f_i = n_exp / (top_k * seq) * sum(int(i in chosen[b, t].tolist()) for t in range(seq))
            p_i = norm[:, i].mean()
            total = total + f_i * p_i
        per_seq.append(total)
    expected_seq = torch.stack(per_seq).mean()
    torch.testing.assert_close(aux["balance_loss"], expected_seq, atol=1e-6, rtol=1e-6)

    # ST-MoE eq. 5: z = (1/N) sum_t (log sum_j exp(logit_tj))^2.
    logits = routing.logits
    expected_z = sum(torch.log(torch.exp(logits[t]).sum()) ** 2 for t in range(logits.shape[0])) / logits.shape[0]
    torch.testing.assert_close(aux["z_loss"], expected_z, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(aux["loss"], 1e-3 * expected_seq + 1e-2 * expected_z, atol=1e-6, rtol=1e-6)

    # Both losses train the router.
    aux["loss"].backward()
    assert ours.router.weight.grad.abs().sum() > 0


def _reference_routed(layer: MoE, x: torch.Tensor, routing: Routing, keep: torch.Tensor | None = None):
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


@pytest.mark.parametrize("impl", ["grouped_mm", "padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_experts_match_reference_loop_forward_and_backward(impl, dtype):
    cfg = MoEConfig(d_model=D, n_experts=8, top_k=2, expert_ffn_dim=FFN, experts_impl=impl)
    torch.manual_seed(0)
    layer = MoE(cfg)
    layer.init_weights(std=0.1)
    layer.router.weight.data.normal_(std=1.0)
    layer.to(dtype)
    ref = MoE(cfg).to(dtype)
    ref.load_state_dict(layer.state_dict())

    x = torch.randn(64, D, dtype=dtype)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, _ = layer(x1)
    y_ref = _reference_routed(ref, x2, ref.router(x2))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(y, y_ref, **tol)

    grad = torch.randn_like(y)
    (y * grad).sum().backward()
    (y_ref * grad).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, **tol)
    for (name, p), p_ref in zip(layer.named_parameters(), ref.parameters()):
        scale = p_ref.grad.abs().max().item()
        torch.testing.assert_close(p.grad / scale, p_ref.grad / scale, **tol, msg=name)


@pytest.mark.parametrize("block_bytes", [None, 3 * 2 * 8 * 4])
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_equals_its_autograd_composition(dtype, scaled, overwrite, block_bytes, monkeypatch):
    """The fused gate: silu(gate) * up, times an fp32 per-row scale in fp32; gradients for the product and the
    scale as autograd gives them for the plain composition, in the same roundings; in one block of rows or in
    several (3 rows of fp32, 6 of bf16: 15 rows end in a partial block)."""
    if block_bytes is not None:
        monkeypatch.setattr(experts_module, "_CPU_BLOCK_BYTES", block_bytes)
    torch.manual_seed(0)
    h = torch.randn(3, 5, 2 * 8, dtype=dtype)
    scale = torch.rand(3, 5) if scaled else None
    ha, hb = h.clone().requires_grad_(), h.clone().requires_grad_()
    sa = sb = None
    if scaled:
        sa, sb = scale.clone().requires_grad_(), scale.clone().requires_grad_()
    product = ha * 1  # an intermediate, as the experts' matmul output is
    out = swiglu(product, sa, overwrite=overwrite)
    gate, up = hb.chunk(2, dim=-1)
    ref = F.silu(gate) * up
    if scaled:
        ref = (ref * sb.unsqueeze(-1)).to(dtype)
    assert out.dtype == dtype and torch.equal(out, ref)
    grad = torch.randn_like(out)
    out.backward(grad, retain_graph=True)
    ref.backward(grad)
    assert torch.equal(ha.grad, hb.grad)
    assert torch.equal(ha.detach(), h)
    if scaled:  # a dot product over ffn, summed in another order
        torch.testing.assert_close(sa.grad, sb.grad, atol=1e-6, rtol=1e-6)
    if overwrite:  # the gradient took the product's memory: a second backward is refused, not silently wrong
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.backward(grad)
    else:
        assert torch.equal(product.detach(), h)


def test_swiglu_overwrite_leaves_a_viewed_product_intact():
    """A product that is a strided view of another tensor gets a gradient buffer of its own."""
    torch.manual_seed(0)
    base = torch.randn(2 * 8, 5, requires_grad=True)
    product = (base * 1).t()
    kept = product.detach().clone()
    swiglu(product, overwrite=True).sum().backward()
    assert torch.equal(product.detach(), kept)
    ref = base.detach().clone().requires_grad_()
    gate, up = ref.t().chunk(2, dim=-1)
    (F.silu(gate) * up).sum().backward()
    torch.testing.assert_close(base.grad, ref.grad, atol=1e-7, rtol=1e-6)  # strided and contiguous loops round apart


@pytest.mark.parametrize("copies", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_permute_rows_equals_indexing_forward_and_backward(copies, dtype):
    torch.manual_seed(0)
    x = torch.randn(10, 6, dtype=dtype)
    order = torch.randperm(10 * copies)
    inverse = invert_permutation(order)
    assert torch.equal(order[inverse], torch.arange(10 * copies))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = permute_rows(xa, order, inverse, copies), xb[order // copies]
    assert torch.equal(ya, yb)
    assert torch.equal(permute_rows(ya, inverse, order), xb.repeat_interleave(copies, 0))  # and back
    grad = torch.randn_like(ya)
    ya.backward(grad)
    yb.backward(grad)
    # Each row's copies are summed in another order than the scatter-add's, and bf16 rounds once, not per add.
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(xa.grad, xb.grad, **tol)


@pytest.mark.parametrize("copies", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sum_copies_is_the_adjoint_of_permute_rows(copies, dtype):
    """sum_copies puts permuted copies back and sums each row's in fp32, rounded once to the input's dtype; its
    gradient spreads them again. Sums of a few bf16 values often fall halfway between two bf16 numbers: those
    round to even, as one rounding of the fp32 sum does."""
    torch.manual_seed(0)
    order = torch.randperm(10 * copies)
    inverse = invert_permutation(order)
    ya = (100 * torch.randn(10 * copies, 64)).to(dtype).requires_grad_()
    yb = ya.detach().clone().requires_grad_()
    out = sum_copies(ya, order, inverse, copies)
    ref = yb[inverse].view(10, copies, 64).float().sum(1).to(dtype)
    assert out.dtype == dtype and torch.equal(out, ref)
    grad = torch.randn(10, 64, dtype=dtype)
    out.backward(grad)
    ref.backward(grad)
    assert ya.grad.dtype == dtype and torch.equal(ya.grad, yb.grad)
    # <permute_rows(x), y> = <x, sum_copies(y)>: one is the other's transpose
    x, y = torch.randn(10, 6), torch.randn(10 * copies, 6)
    torch.testing.assert_close((permute_rows(x, order, inverse, copies) * y).sum(),
                               (x * sum_copies(y, order, inverse, copies)).sum(), atol=1e-5, rtol=1e-5)


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


def test_w13_stacks_gate_and_up_so_ffn_shards_are_self_contained():
    gate, up = torch.arange(6.0).view(1, 3, 2), -torch.arange(6.0).view(1, 3, 2)
    w13 = fuse_gate_up(gate, up)
    assert w13.shape == (1, 2, 3, 2) and torch.equal(w13[0, 0], gate[0]) and torch.equal(w13[0, 1], up[0])
    assert all(torch.equal(a, b) for a, b in zip(split_gate_up(w13), (gate, up)))
    assert torch.equal(w13.flatten(1, 2), torch.cat([gate, up], dim=1))  # transformers' gate_up_proj, same memory

    # Two tensor-parallel shards: ffn units [0, ffn/2) and [ffn/2, ffn) of w13 with the matching halves of w2.
    torch.manual_seed(0)
    full = GroupedExperts(4, D, FFN, impl="grouped_mm")
    full.init_weights(std=0.1, out_std=0.1)
    x, counts = torch.randn(24, D), torch.tensor([6, 0, 10, 5])
    shards = []
    for k in range(2):
        shard = GroupedExperts(4, D, FFN // 2, impl="grouped_mm")
        with torch.no_grad():
            shard.w13.copy_(full.w13[:, :, k * FFN // 2:(k + 1) * FFN // 2])
            shard.w2.copy_(full.w2[:, :, k * FFN // 2:(k + 1) * FFN // 2])
        shards.append(shard(x, counts))
    torch.testing.assert_close(shards[0] + shards[1], full(x, counts), atol=1e-6, rtol=1e-5)
    assert full(x, counts)[21:].abs().sum() == 0  # rows past the last group come out as zeros


def test_init_draws_gate_and_up_from_the_input_std():
    experts = GroupedExperts(8, D, FFN)
    experts.init_weights(std=0.05, out_std=0.01)
    for w in (*split_gate_up(experts.w13), experts.w13):
        assert w.std().item() == pytest.approx(0.05, rel=0.05)
    assert experts.w2.std().item() == pytest.approx(0.01, rel=0.05)


def test_auto_impl_choice():
    experts = MoE(MoEConfig(d_model=D, n_experts=4, top_k=2, expert_ffn_dim=FFN)).experts
    x = torch.randn(32, D)
    # grouped_mm whenever it accepts the operands.
    assert experts._choose_impl(x, experts.w13, experts.w2) == "grouped_mm"

    # d_model 12 in fp32 is 48 bytes (aligned), ffn 10 is 40 bytes (not): grouped_mm would refuse.
    layer = MoE(MoEConfig(d_model=12, n_experts=4, top_k=2, expert_ffn_dim=10))
    layer.router.weight.data.normal_()
    x = torch.randn(16, 12)
    assert layer.experts._choose_impl(x, layer.experts.w13, layer.experts.w2) == "padded"
    y, _ = layer(x)
    torch.testing.assert_close(y, _reference_routed(layer, x, layer.router(x)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["auto", "padded"])
def test_experts_under_autocast_run_in_its_dtype(impl):
    """grouped_mm is on none of autocast's lists; the experts cast its operands as autocast casts a matmul's, so
    bf16 autocast over fp32 weights computes exactly what a bf16 copy computes, with fp32 gradients."""
    torch.manual_seed(0)
    experts = GroupedExperts(4, D, FFN, impl)
    experts.init_weights(std=0.1, out_std=0.1)
    copy = GroupedExperts(4, D, FFN, impl).to(torch.bfloat16)
    copy.load_state_dict(experts.state_dict())
    x, counts, scale = torch.randn(32, D), torch.tensor([10, 6, 9, 7]), torch.rand(32)
    xa, xb = x.clone().requires_grad_(), x.to(torch.bfloat16).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = experts(xa, counts, dropless=True, scale=scale)
    y_copy = copy(xb, counts, dropless=True, scale=scale)
    assert y.dtype == torch.bfloat16 and torch.equal(y, y_copy)
    grad = torch.randn_like(y)
    y.backward(grad)
    y_copy.backward(grad)
    assert xa.grad.dtype == torch.float32 and torch.equal(xa.grad, xb.grad.float())
    for p, p_copy in zip(experts.parameters(), copy.parameters()):
        assert p.grad.dtype == torch.float32 and torch.equal(p.grad, p_copy.grad.float())


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
    torch.testing.assert_close(y, _reference_routed(layer, x, routing, keep), atol=1e-5, rtol=1e-5)

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


def test_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match="did you mean 'top_k'"):
        validate(MoEConfig, {"d_model": 8, "n_experts": 4, "topk": 2, "expert_ffn_dim": 8})
    with pytest.raises(ConfigError, match="divisible by n_groups"):
        validate(MoEConfig, {"d_model": 8, "n_experts": 6, "top_k": 2, "expert_ffn_dim": 8, "n_groups": 4})
    with pytest.raises(ConfigError, match="top_k"):
        validate(MoEConfig, {"d_model": 8, "n_experts": 8, "top_k": 6, "expert_ffn_dim": 8, "n_groups": 4,
                             "topk_groups": 1})
    with pytest.raises(ConfigError, match="shared_expert_gate"):
        validate(MoEConfig, {"d_model": 8, "n_experts": 4, "top_k": 2, "expert_ffn_dim": 8, "shared_expert_gate": True})
