"""DiT's tensor-parallel plan as plain data: each block's attention and MLP split Megatron-style.

The fused qkv projection and the MLP's first layer are column-parallel (the qkv outputs are laid out head by head,
so each rank holds whole heads), the attention's and MLP's output projections row-parallel, which sum the ranks'
shares back into whole, replicated tokens. Everything else (patch and condition embeddings, the adaLN regressors,
the final layer) stays replicated: per-token work there is small next to the blocks'.
"""

from __future__ import annotations

from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from longboat.config.base import ConfigError
from longboat.models.diffusion.dit import DiTConfig


def tensor_parallel_plan(cfg: DiTConfig, tp: int) -> dict[str, ParallelStyle]:
    """Module name pattern (``*`` is one block index) -> parallel style, after checking ``tp`` divides the heads
    and the MLP width."""
    if cfg.num_heads % tp or cfg.mlp_hidden % tp:
        raise ConfigError(f"parallel.tp={tp} must divide the model's num_heads ({cfg.num_heads}) and its MLP width "
                          f"({cfg.mlp_hidden}) so that each rank holds whole heads and an equal MLP slice")
    return {
        "blocks.*.attn.qkv": ColwiseParallel(),
        "blocks.*.attn.proj": RowwiseParallel(),
        "blocks.*.mlp.fc1": ColwiseParallel(),
        "blocks.*.mlp.fc2": RowwiseParallel(),
    }
