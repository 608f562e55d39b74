"""SwiGLU experts stored as stacked weights and run as one grouped (or padded batched) matmul per projection.

Gate and up projections live in one weight ``w13`` [E, 2, ffn, d] (gate at index 0 of dim 1, up at 1). Flattened to
[E, 2·ffn, d] it is one matmul computing both, whose output holds gate and up as contiguous halves; a slice along
dim 2 (a tensor-parallel shard) holds the gate and up rows of the same ffn indices, and flattens the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SwiGLU(nn.Module):
    """Dense SwiGLU feed-forward: w2(silu(w1 x) * w3 x). Used for shared experts."""

    def __init__(self, d_model: int, ffn_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, d_model, bias=False)
        self.w3 = nn.Linear(d_model, ffn_dim, bias=False)

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.w1.weight, std=std)
        nn.init.normal_(self.w3.weight, std=std)
        nn.init.normal_(self.w2.weight, std=out_std)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def grouped_mm_supported(*tensors: Tensor) -> bool:
    """Whether torch's grouped_mm kernel accepts these operands (it needs 16-byte aligned rows)."""
    if not hasattr(F, "grouped_mm"):
        return False
    # Eager CPU takes fp32 and bf16. Compiled graphs and CUDA's fast kernel are bf16-only; for other
    # dtypes CUDA falls back to one matmul per group after a host sync, so the padded path is better.
    all_bf16 = all(t.dtype == torch.bfloat16 for t in tensors)
    if (torch.compiler.is_compiling() or tensors[0].device.type != "cpu") and not all_bf16:
        return False
    rows_aligned = all(t.shape[-1] * t.element_size() % 16 == 0 for t in tensors)
    if torch.compiler.is_compiling():  # data_ptr() would break the graph; compiled buffers are aligned
        return rows_aligned
    return rows_aligned and all(t.data_ptr() % 16 == 0 for t in tensors)


def fuse_gate_up(gate: Tensor, up: Tensor) -> Tensor:
    """Gate and up weights [..., ffn, d] -> ``w13`` [..., 2, ffn, d]."""
    return torch.stack([gate, up], dim=-3)


def split_gate_up(w13: Tensor) -> tuple[Tensor, Tensor]:
    """``w13`` [..., 2, ffn, d] -> (gate, up), each [..., ffn, d] (views)."""
    gate, up = w13.unbind(-3)
    return gate, up


class GroupedExperts(nn.Module):
    """E SwiGLU experts: w13 (gate and up) [E, 2, ffn, d], w2 (down) [E, d, ffn].

    Input rows arrive sorted by expert: rows [offs[e-1], offs[e]) belong to expert e, where
    offs = cumsum(counts). Rows past the last group (dropped token copies) come out as zeros; a caller that drops
    nothing says so (``dropless=True``) and saves the two passes that zero them. An optional ``scale`` per row (the
    routing weights) multiplies the gated hidden units before the down projection, as Megatron-LM does: the same as
    scaling the output, on ffn instead of d_model values, and the product backward keeps is that much smaller.
    """

    def __init__(self, n_experts: int, d_model: int, ffn_dim: int, impl: str = "auto") -> None:
        super().__init__()
        self.n_experts = n_experts
        self.impl = impl
        self.w13 = nn.Parameter(torch.empty(n_experts, 2, ffn_dim, d_model))
        self.w2 = nn.Parameter(torch.empty(n_experts, d_model, ffn_dim))

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.w13, std=std)  # gate and up alike, as two separate weights would be
        nn.init.normal_(self.w2, std=out_std)

    def forward(self, x: Tensor, counts: Tensor, dropless: bool = False, scale: Tensor | None = None) -> Tensor:
        """x [S, d] sorted by expert, counts [E] rows per expert (sum <= S; == S when dropless), scale [S] -> [S, d]."""
        w13, w2 = self.w13, self.w2
        if torch.is_autocast_enabled(x.device.type):
            # grouped_mm is on none of autocast's lists: cast its operands as autocast casts any matmul's.
            dtype = torch.get_autocast_dtype(x.device.type)
            x, w13, w2 = x.to(dtype), w13.to(dtype), w2.to(dtype)
        impl = self._choose_impl(x, w13, w2) if self.impl == "auto" else self.impl
        if impl == "grouped_mm":
            return self._grouped(x, w13, w2, counts, dropless, scale)
        return self._padded(x, w13, w2, counts, scale)

    @staticmethod
    def _choose_impl(x: Tensor, w13: Tensor, w2: Tensor) -> str:
        # grouped_mm measured 4-10% faster than the padded bmm on CPU (bench/moe.py, idle machine) and
        # avoids padding entirely; the padded path serves the operands grouped_mm refuses.
        return "grouped_mm" if grouped_mm_supported(x, w13, w2) else "padded"

    def _grouped(self, x: Tensor, w13: Tensor, w2: Tensor, counts: Tensor, dropless: bool,
                 scale: Tensor | None) -> Tensor:
        offs = counts.cumsum(0).to(torch.int32)
        # grouped_mm leaves rows past offs[-1] uninitialised in its output and its input gradient; zeroing them
        # around each product keeps that garbage out of the result and out of every gradient (scale's included).
        tail = None if dropless else (torch.arange(x.shape[0], device=x.device) >= offs[-1]).unsqueeze(-1)
        h13 = _zero_tail(F.grouped_mm(_zero_tail(x, tail), _gate_up_operand(w13), offs=offs), tail)
        h = _zero_tail(swiglu(h13, scale, overwrite=True), tail)
        return _zero_tail(F.grouped_mm(h, w2.transpose(-2, -1), offs=offs), tail)

    def _padded(self, x: Tensor, w13: Tensor, w2: Tensor, counts: Tensor, scale: Tensor | None) -> Tensor:
        """Gather rows into an [E, max_count, d] buffer (zero-padded) and run two batched matmuls."""
        n_rows, d = x.shape
        n_exp = self.n_experts
        ends = counts.cumsum(0)
        starts = ends - counts
        # One host sync (the grouped path has none). Two slots at least: torch.compile cannot lower a batched matmul
        # whose (data-dependent) row count might be 1, so this keeps fp32 blocks compilable.
        cap = max(int(counts.max()), 2)
        # Slot (e, r) holds row starts[e] + r, or an appended zero row when expert e has fewer rows.
        r = torch.arange(cap, device=x.device)
        src = torch.where(r < counts.unsqueeze(1), starts.unsqueeze(1) + r, n_rows)
        buf = torch.cat([x, x.new_zeros(1, d)]).index_select(0, src.flatten()).view(n_exp, cap, d)
        if scale is not None:
            scale = torch.cat([scale, scale.new_zeros(1)]).index_select(0, src.flatten()).view(n_exp, cap)
        h = swiglu(torch.bmm(buf, _gate_up_operand(w13)), scale, overwrite=True)
        y = torch.bmm(h, w2.transpose(1, 2)).view(n_exp * cap, d)
        # Row s of expert e sits at slot e * cap + (s - starts[e]); rows past the last group read a zero row.
        rows = torch.arange(n_rows, device=x.device)
        expert = torch.searchsorted(ends, rows, right=True)
        e = expert.clamp(max=n_exp - 1)
        slot = torch.where(expert < n_exp, e * cap + rows - starts[e], n_exp * cap)
        return torch.cat([y, y.new_zeros(1, d)]).index_select(0, slot)


def _gate_up_operand(w13: Tensor) -> Tensor:
    """w13 [E, 2, ffn, d] as the [E, d, 2·ffn] right operand: gate columns, then up columns."""
    return w13.flatten(1, 2).transpose(-2, -1)


# On CPU the SwiGLU's elementwise chain runs over blocks of rows of about this many bytes, so that its temporaries
# (fp32 copies for a half-precision product among them) stay small and in cache instead of each op streaming whole
# activations through memory; accelerators take all rows at once.
_CPU_BLOCK_BYTES = 1 << 20


def _row_blocks(rows: int, h: Tensor) -> list[slice]:
    if h.device.type != "cpu":
        return [slice(0, rows)]
    step = max(1, _CPU_BLOCK_BYTES // (h.shape[-1] * h.element_size()))
    return [slice(start, start + step) for start in range(0, rows, step)]


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up * scale for gate and up, the two halves of the last dimension of one projection's output.

    One function rather than autograd's four nodes: backward writes the gradients of gate and up straight into the
    two halves of one buffer instead of concatenating them. With ``overwrite`` that buffer is the saved product itself,
    for a caller whose product nothing else reads (a matmul's output: the matmul saves its inputs); autograd's version
    check then refuses a second backward through the graph.
    """

    @staticmethod
    def forward(ctx, h: Tensor, scale: Tensor | None, overwrite: bool) -> Tensor:
        lead, width = h.shape[:-1], h.shape[-1]
        flat_h = h.reshape(-1, width)
        hidden = flat_h.new_empty(flat_h.shape[0], width // 2)
        out = hidden if scale is None else torch.empty_like(hidden)
        flat_scale = None if scale is None else scale.reshape(-1, 1)
        for rows in _row_blocks(flat_h.shape[0], flat_h):
            gate, up = flat_h[rows].chunk(2, dim=-1)
            torch.ops.aten.silu.out(gate, out=hidden[rows]).mul_(up)
            if flat_scale is not None:  # in the scale's precision (fp32 routing weights), rounded once to h's dtype
                torch.mul(hidden[rows], flat_scale[rows], out=out[rows])
        ctx.overwrite = overwrite
        ctx.save_for_backward(h, None if scale is None else hidden, scale)
        return out.view(*lead, width // 2)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor | None, None]:
        h, hidden, scale = ctx.saved_tensors
        width = h.shape[-1]
        overwrite = ctx.overwrite and h.is_contiguous()
        grad_h = h if overwrite else torch.empty(h.shape, dtype=h.dtype, device=h.device)
        flat_h, flat_grad_h, flat_grad = h.reshape(-1, width), grad_h.view(-1, width), grad.reshape(-1, width // 2)
        grad_scale = None
        if scale is not None:
            flat_scale = scale.reshape(-1, 1)
            flat_hidden = hidden.view(-1, width // 2)
            if ctx.needs_input_grad[1]:
                grad_scale = torch.empty(flat_scale.shape[0], dtype=scale.dtype, device=scale.device)
        for rows in _row_blocks(flat_h.shape[0], flat_h):
            g = flat_grad[rows]
            if scale is not None:
                if grad_scale is not None:
                    torch.linalg.vecdot(g.to(scale.dtype), flat_hidden[rows].to(scale.dtype), out=grad_scale[rows])
                g = torch.mul(g, flat_scale[rows], out=torch.empty_like(g))
            gate, up = flat_h[rows].chunk(2, dim=-1)
            grad_gate, grad_up = flat_grad_h[rows].chunk(2, dim=-1)
            grad_silu = g * up
            torch.mul(g, F.silu(gate), out=grad_up)  # after up's last read: it may be the same memory
            torch.ops.aten.silu_backward.grad_input(grad_silu, gate, grad_input=grad_gate)
        if grad_scale is not None:
            grad_scale = grad_scale.view(scale.shape)
        return grad_h, grad_scale, None


def swiglu(h: Tensor, scale: Tensor | None = None, overwrite: bool = False) -> Tensor:
    """h [..., 2·ffn] (gate half, then up half) and an optional per-row scale [...] -> silu(gate) * up * scale
    [..., ffn] in h's dtype. The scale multiplies in its own precision (fp32 routing weights). ``overwrite``: backward
    may write h's gradient over h (pass it only for a product nothing else reads, such as a matmul's fresh output).
    """
    if torch.compiler.is_compiling():  # the same ops, left for the compiler to fuse
        gate, up = h.chunk(2, dim=-1)
        hidden = F.silu(gate) * up
        return hidden if scale is None else (hidden * scale.unsqueeze(-1)).to(h.dtype)
    return _SwiGLU.apply(h, scale, overwrite)


def _zero_tail(t: Tensor, tail: Tensor | None) -> Tensor:
    return t if tail is None else t.masked_fill(tail, 0)
