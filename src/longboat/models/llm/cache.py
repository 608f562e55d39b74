"""Static key/value cache for incremental decoding: preallocated once, filled position by position."""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer keys and values [B, n_kv_heads, max_len, head_dim] plus the number of filled positions.

    Every layer writes its new keys/values at ``length`` during a forward pass; the model calls
    ``advance`` once after all layers, so all layers see the same offset.
    """

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, n_kv_heads, T, head_dim] after the filled part; return all keys/values so far."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {end} positions needed, cache holds {self.max_len}")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def reset(self) -> None:
        self.length = 0


def chunk_attention_mask(start: int, T: int, device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """(attn_mask, is_causal) for T queries at positions start..start+T-1 over start+T cached keys.

    Each query sees every key up to its own position; SDPA's is_causal would align the diagonal to the
    top-left instead, so a chunk after a non-empty cache needs an explicit mask.
    """
    if start == 0 or T == 1:
        return None, T > 1
    rows = torch.arange(start, start + T, device=device)[:, None]
    return torch.arange(start + T, device=device)[None, :] <= rows, False
