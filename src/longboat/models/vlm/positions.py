"""Multimodal RoPE positions [3, B, T] (time, height, width) of a batch with images, as Qwen2-VL and later number them.

Text tokens advance all three rows by one. An image's tokens (its merged grid, ``t × h × w`` in reading order) take
the position ``p`` its first token would have had, plus their frame, row and column: ``(p + t_i, p + r, p + c)``;
the text after it continues from ``p + max(h, w)`` (what transformers' ``get_rope_index`` gives for images). So an
image takes fewer positions than tokens and every later position of its sample shifts back by the difference.

A packed row holds several samples whose 1-D positions restart at 0; the shift restarts with them, so each sample is
numbered as if alone. Decoding after a KV cache starts every row at the cache's ``next_position``.
"""

from __future__ import annotations

import torch


def image_starts(index: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The flat index of each image's first token, from every image token's flat index [N] (images in order) and the
    tokens of each image [images]."""
    return index[torch.cumsum(counts, 0) - counts]


def mrope_positions(shape: tuple[int, int], index: torch.Tensor, grids: torch.Tensor,
                    positions: torch.Tensor | None = None, base: torch.Tensor | None = None) -> torch.Tensor:
    """Positions [3, B, T] for tokens of ``shape`` (B, T).

    ``index`` [N]: the flat (``row · T + column``) index of every image token, images one after the other, each
    image's tokens contiguous in a row; ``grids`` [images, 3]: each image's merged grid (frames, rows, columns);
    ``positions`` [B, T]: 1-D positions restarting at 0 at each packed sample (default 0..T-1); ``base`` [B]: added
    to every row (a KV cache's next position).
    """
    B, T = shape
    device = index.device
    p = torch.arange(T, device=device).expand(B, T) if positions is None else positions.to(device)
    counts = grids.prod(dim=1).to(device)
    starts = image_starts(index, counts)
    rows, cols = starts // T, starts % T
    # After each image, its sample's positions step back by (tokens - max(h, w)); summed along the row from the
    # token after the image, and restarted at each sample's first token (position 0).
    step = torch.zeros(B, T + 1, dtype=torch.long, device=device)
    advance = torch.maximum(grids[:, 1], grids[:, 2]).to(device)
    step.index_put_((rows, cols + counts), advance - counts, accumulate=True)
    shift = step.cumsum(dim=1)[:, :T]
    first = torch.where(p == 0, torch.arange(T, device=device), 0).cummax(dim=1).values
    text = p + shift - shift.gather(1, first)
    if base is not None:
        text = text + base.to(device)[:, None]
    out = text.unsqueeze(0).repeat(3, 1, 1)
    if len(index):
        start = text.flatten()[starts]
        within = torch.arange(len(index), device=device) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts,
                                                                                   counts)
        h, w = (torch.repeat_interleave(grids[:, k].to(device), counts) for k in (1, 2))
        offsets = torch.stack([within // (h * w), within % (h * w) // w, within % w])
        out.view(3, -1)[:, index] = torch.repeat_interleave(start, counts) + offsets
    return out
