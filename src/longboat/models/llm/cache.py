"""Static key/value cache for incremental decoding: preallocated once, filled position by position."""

from __future__ import annotations

import torch


class StaticCache:
    """Two per-layer buffers [n_layers, ...] with a shared time axis, plus the number of filled positions.

    Every layer writes its new entries at ``length`` during a forward pass; the model calls ``advance``
    once after all layers, so all layers see the same offset. ``positions`` [B, max_len] keeps each cached token's
    rotary position (the largest of its three under multimodal RoPE, where an image's tokens take fewer positions
    than tokens), so that what follows a cache, rewound or not, continues from ``next_position``.
    """

    def __init__(self, shape_a: tuple[int, ...], shape_b: tuple[int, ...], time_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        self._a = torch.zeros(shape_a, dtype=dtype, device=device)
        self._b = torch.zeros(shape_b, dtype=dtype, device=device)
        self._time_dim = time_dim  # in the buffers, layer axis included
        self.positions = torch.zeros(shape_a[1], shape_a[time_dim], dtype=torch.long, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self._a.shape[self._time_dim]

    def update(self, layer: int, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``a`` and ``b`` after the filled part of ``layer``; return everything cached so far."""
        end = self.length + a.shape[self._time_dim - 1]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {end} positions needed, cache holds {self.max_len}")
        t = self._time_dim - 1  # time axis within one layer's buffer
        filled_a, filled_b = self._a[layer].narrow(t, 0, end), self._b[layer].narrow(t, 0, end)
        filled_a.narrow(t, self.length, end - self.length).copy_(a)
        filled_b.narrow(t, self.length, end - self.length).copy_(b)
        return filled_a, filled_b

    def advance(self, n: int) -> None:
        self.length += n

    def keep_positions(self, positions: torch.Tensor) -> None:
        """Record the positions [B or 1, T] (or multimodal [3, B, T]) of the T entries the next ``advance`` adds."""
        if positions.dim() == 3:
            positions = positions.amax(dim=0)
        self.positions[:, self.length:self.length + positions.shape[-1]] = positions

    def next_position(self) -> torch.Tensor:
        """[B]: one past the largest position cached (0 for an empty cache)."""
        if self.length == 0:
            return torch.zeros(self.positions.shape[0], dtype=torch.long, device=self.positions.device)
        return self.positions[:, :self.length].amax(dim=1) + 1

    def rewind(self, length: int) -> None:
        """Forget every position from ``length`` on; the next update writes there (a conversation edited)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot rewind a cache of {self.length} positions to {length}")
        self.length = length


class KVCache(StaticCache):
    """Keys and values [n_layers, B, n_kv_heads, max_len, head_dim] for grouped-query attention."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        super().__init__(shape, shape, time_dim=3, dtype=dtype, device=device)


def chunk_attention_mask(start: int, T: int, device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """(attn_mask, is_causal) for T queries at positions start..start+T-1 over start+T cached keys.

    Each query sees every key up to its own position; SDPA's is_causal would align the diagonal to the
    top-left instead, so a chunk after a non-empty cache needs an explicit mask.
    """
    if start == 0 or T == 1:
        return None, T > 1
    rows = torch.arange(start, start + T, device=device)[:, None]
    return torch.arange(start + T, device=device)[None, :] <= rows, False
