"""The backbone's layers as the flow VLA runs them over the prefix: each returns its keys and values as outputs.

The action expert's layer i attends to backbone layer i's prefix keys and values. Returned beside the layer's output
(not collected on the side), they are outputs of the layer's module, so FSDP unshards its weights again when their
gradients arrive and activation checkpointing recomputes them: each layer can be an FSDP and checkpointing unit.
A ``PrefixBlock`` holds the decoder block's own submodules, so parameter names (``backbone.layers.<i>.attention.wq``
...) and checkpoints are unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from longboat.models.llm.model import Block


class _KeysValues:
    """Takes the place of a decoding cache in the attention: keeps the layer's keys and values (no in-place writes:
    training needs their gradients)."""

    k: torch.Tensor
    v: torch.Tensor

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k, self.v = k, v
        return k, v


class PrefixBlock(nn.Module):
    """A dense decoder ``Block`` over the prefix: (x, cos, sin, mask) -> (x, keys, values), keys and values
    [B, kv_heads, P, head_dim]."""

    def __init__(self, block: Block):
        super().__init__()
        if block.is_moe:
            raise ValueError("PrefixBlock: a dense block only (the flow VLA's backbone has no MoE layers)")
        self.attention_norm, self.attention = block.attention_norm, block.attention
        self.ffn_norm, self.feed_forward = block.ffn_norm, block.feed_forward

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kv = _KeysValues()
        x = x + self.attention(self.attention_norm(x), cos, sin, kv, mask)
        return x + self.feed_forward(self.ffn_norm(x)), kv.k, kv.v

    init_weights = Block.init_weights  # the decoder's initialisation of the same submodules
