"""The decoder's tensor-parallel plan (Megatron-style TP with sequence parallel), as plain data.

Activations between blocks are sharded over the sequence (``Shard(1)``); each attention and feed-forward
gathers its input, runs column-parallel in-projections and a row-parallel out-projection that reduce-scatters
back onto the sequence. Norms run on sequence shards with replicated weights. Only ``longboat.distributed``
applies the plan; the model stays plain single-device PyTorch.

The head reads ``output_weight`` with ``F.linear`` (tied or not), so the logits come out as a DTensor sharded over
the vocabulary; the root entry ``""`` gathers them into an ordinary tensor for the loss. Tied embeddings work
because the embedding (row-wise) and a column-wise head both shard the ``[vocab, d_model]`` table on dim 0.
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
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


def check_tensor_parallel(cfg: DecoderConfig, tp: int) -> None:
    """Each TP rank must hold whole query and key/value heads."""
    if tp > 1 and (cfg.moe is not None or cfg.attention == "mla"):
        # Experts would need expert parallelism (an ep mesh axis) and MLA a plan for its latent projections.
        raise ConfigError(
            f"parallel.tp={tp}: tensor parallelism supports dense grouped-query decoders only; this model has "
            + ("mixture-of-experts layers" if cfg.moe is not None else "multi-head latent attention")
            + " (use tp=1 with FSDP/DDP)"
        )
    if tp > 1 and (cfg.n_heads % tp or cfg.kv_heads % tp):
        raise ConfigError(
            f"parallel.tp={tp} must divide the model's n_heads ({cfg.n_heads}) and n_kv_heads ({cfg.kv_heads}) "
            "so that each rank holds whole heads"
        )


def tensor_parallel_plan(cfg: DecoderConfig) -> dict[str, ParallelStyle]:
    """Module name pattern (``*`` matches one block index; ``""`` is the root) → parallel style."""
    block_input = PrepareModuleInput(  # attention(x, cos, sin, cache, mask): gather x; the rest stay plain tensors
        input_layouts=(Shard(1), None, None, None, None),
        desired_input_layouts=(Replicate(), None, None, None, None),
        use_local_output=True,
    )
    plan: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "layers.*.attention_norm": SequenceParallel(),
        "layers.*.attention": block_input,
        "layers.*.attention.wq": ColwiseParallel(),
        "layers.*.attention.wk": ColwiseParallel(),
        "layers.*.attention.wv": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        ),
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w3": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        # Logits [B, T, vocab] leave the model whole, so the task's loss needs no parallel awareness.
        "": PrepareModuleOutput(output_layouts=Shard(-1), desired_output_layouts=Replicate(), use_local_output=True),
    }
    if cfg.qk_norm:
        # Per-head norms see this rank's heads ([B, T, local heads, head_dim]): shards of dim 2.
        plan["layers.*.attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan["layers.*.attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    if not cfg.tie_embeddings:
        plan["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    return plan


def checked_tensor_parallel_plan(cfg: DecoderConfig, tp: int) -> dict[str, ParallelStyle]:
    """The plan for ``tp`` ranks, after checking that each rank can hold whole heads."""
    check_tensor_parallel(cfg, tp)
    return tensor_parallel_plan(cfg)
