"""Grouped experts: equal to a reference loop forward and backward, the fused SwiGLU, w13's layout, init, the
implementation choice and autocast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import longboat.models.moe.experts as experts_module
from longboat.models.moe import GroupedExperts, MoE, MoEConfig, fuse_gate_up, split_gate_up
from longboat.models.moe.experts import swiglu
from tests.models.moe.conftest import D, FFN, reference_routed


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
    y_ref = reference_routed(ref, x2, ref.router(x2))
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
    torch.testing.assert_close(y, reference_routed(layer, x, layer.router(x)), atol=1e-5, rtol=1e-5)


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
