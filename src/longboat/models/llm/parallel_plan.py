"""The decoder's tensor-parallel plan (Megatron-style TP with sequence parallel), as plain data.

Activations between blocks are sharded over the sequence (``Shard(1)``); each attention and feed-forward
gathers its input, runs column-parallel in-projections and a row-parallel out-projection that reduce-scatters
back onto the sequence. Norms run on sequence shards with replicated weights. Only ``longboat.distributed``
applies the plan; the model stays plain single-device PyTorch.

Multi-head latent attention splits its heads the same way around a replicated latent; a mixture of experts splits
every expert (routed and shared) along its ffn dimension and runs a replicated router on the gathered sequence
(``models/moe/tensor_parallel.py``). Modules without an entry stay plain, replicated tensors.

The head reads ``output_weight`` with ``F.linear`` (tied or not), so the logits come out as a DTensor sharded over
the vocabulary; the root entry ``""`` gathers them into an ordinary tensor for the loss. Tied embeddings work
because the embedding (row-wise) and a column-wise head both shard the ``[vocab, d_model]`` table on dim 0.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

from longboat.config.base import ConfigError
from longboat.models.llm.config import DecoderConfig
from longboat.models.moe.tensor_parallel import moe_layer_plan, sum_gradient_over


def check_tensor_parallel(cfg: DecoderConfig, tp: int) -> None:
    """Each TP rank must hold whole query and key/value heads (MLA: whole heads; its latent is shared by all)."""
    if tp == 1:
        return
    if cfg.attention == "mla":
        if cfg.n_heads % tp:
            raise ConfigError(
                f"parallel.tp={tp} must divide the model's n_heads ({cfg.n_heads}) so that each rank holds whole heads"
            )
    elif cfg.n_heads % tp or cfg.kv_heads % tp:
        raise ConfigError(
            f"parallel.tp={tp} must divide the model's n_heads ({cfg.n_heads}) and n_kv_heads ({cfg.kv_heads}) "
            "so that each rank holds whole heads"
        )
    moe = cfg.moe
    if moe is not None:
        widths = {"moe.expert_ffn_dim": moe.expert_ffn_dim}
        if moe.n_shared_experts:
            widths["the shared experts' width (n_shared_experts × shared_ffn_dim)"] = moe.shared_dim
        for what, width in widths.items():
            if width % tp:
                raise ConfigError(
                    f"parallel.tp={tp} must divide {what} ({width}): each rank holds a slice of every expert"
                )


def _gathered_input() -> PrepareModuleInput:
    """A block's first argument arrives sharded over the sequence and is gathered; the rest stay plain tensors."""
    return PrepareModuleInput(
        input_layouts=(Shard(1), None, None, None, None),
        desired_input_layouts=(Replicate(), None, None, None, None),
        use_local_output=True,
    )


def _attention_plan(cfg: DecoderConfig) -> dict[str, ParallelStyle]:
    """Grouped-query attention: q, k and v column-parallel by head, the output row-parallel back onto the sequence."""
    plan: dict[str, ParallelStyle] = {
        "layers.*.attention.wq": ColwiseParallel(),
        "layers.*.attention.wk": ColwiseParallel(),
        "layers.*.attention.wv": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    }
    if cfg.qk_norm:
        # Per-head norms see this rank's heads ([B, T, local heads, head_dim]): shards of dim 2.
        plan["layers.*.attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan["layers.*.attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    return plan


class SumKeyGradient(ParallelStyle):
    """Sum over tp the gradient of a replicated linear layer's last ``width`` outputs; the forward is unchanged.

    For MLA's decoupled RoPE key k_pe (the tail of kv_a_proj_with_mqa): all heads share it, and each rank's
    attention uses it for its own heads only, so the gradient a rank computes is its heads' share. The latent c_kv,
    the other outputs, reaches the heads through the column-parallel kv_b_proj, whose backward sums the shares.
    """

    def __init__(self, width: int):
        self.width = width

    def _sum_tail_gradient(self, out: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        head, tail = out.split([out.shape[-1] - self.width, self.width], dim=-1)
        return torch.cat((head, sum_gradient_over(mesh, tail)), dim=-1)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module.register_forward_hook(lambda _, inputs, out: self._sum_tail_gradient(out, device_mesh))
        return module


def _latent_attention_plan(cfg: DecoderConfig) -> dict[str, ParallelStyle]:
    """MLA: heads split over tp. The latent (down) projections and their norms stay replicated, every rank computing
    the whole (small) latent, which the column-parallel up projections expand into its heads."""
    query_up = "layers.*.attention.q_proj" if cfg.q_lora_rank is None else "layers.*.attention.q_b_proj"
    return {
        query_up: ColwiseParallel(),
        "layers.*.attention.kv_a_proj_with_mqa": SumKeyGradient(cfg.qk_rope_head_dim),
        "layers.*.attention.kv_b_proj": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    }


def _swiglu_plan(prefix: str, output: Placement) -> dict[str, ParallelStyle]:
    return {
        f"{prefix}.w1": ColwiseParallel(),
        f"{prefix}.w3": ColwiseParallel(),
        f"{prefix}.w2": RowwiseParallel(output_layouts=output),
    }


def _feed_forward_plan(cfg: DecoderConfig) -> dict[str, ParallelStyle]:
    dense_input = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
    )
    if cfg.moe is None:
        return {"layers.*.feed_forward": dense_input, **_swiglu_plan("layers.*.feed_forward", Shard(1))}
    plan: dict[str, ParallelStyle] = {}
    for i in range(cfg.n_layers):  # dense and MoE layers differ, so entries name their block
        prefix = f"layers.{i}.feed_forward"
        if cfg.is_moe_layer(i):
            plan.update(moe_layer_plan(prefix, cfg.moe.n_shared_experts > 0, cfg.moe.shared_expert_gate))
        else:
            plan.update({prefix: dense_input, **_swiglu_plan(prefix, Shard(1))})
    return plan


def tensor_parallel_plan(cfg: DecoderConfig) -> dict[str, ParallelStyle]:
    """Module name pattern (``*`` matches one block index; ``""`` is the root) → parallel style."""
    attention = _latent_attention_plan(cfg) if cfg.attention == "mla" else _attention_plan(cfg)
    plan: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "layers.*.attention_norm": SequenceParallel(),
        "layers.*.attention": _gathered_input(),  # attention(x, cos, sin, cache, mask)
        **attention,
        "layers.*.ffn_norm": SequenceParallel(),
        **_feed_forward_plan(cfg),
        "norm": SequenceParallel(),
        # Logits [B, T, vocab] leave the model whole, so the task's loss needs no parallel awareness.
        "": PrepareModuleOutput(output_layouts=Shard(-1), desired_output_layouts=Replicate(), use_local_output=True),
    }
    if not cfg.tie_embeddings:
        plan["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    return plan


def checked_tensor_parallel_plan(cfg: DecoderConfig, tp: int) -> dict[str, ParallelStyle]:
    """The plan for ``tp`` ranks, after checking that each rank can hold whole heads."""
    check_tensor_parallel(cfg, tp)
    return tensor_parallel_plan(cfg)
