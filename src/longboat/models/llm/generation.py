"""Autoregressive decoding with a KV cache: one prefill pass over the prompt, then one token per step.

Works with any model that has ``model(tokens, positions, cache) -> logits [B, T, V]`` and
``model.make_cache(batch, max_len)``.
"""

from __future__ import annotations

from typing import Iterable

import torch


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the smallest set whose probability reaches top_p."""
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:  # also refuses NaN
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p; the first always stays.
        drop = probs.cumsum(dim=-1) - probs >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick one token per row from logits [B, V]: argmax when temperature is 0, else a filtered sample."""
    if not temperature >= 0:  # also refuses NaN
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def generate(
    model,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    stop_ids: Iterable[int] = (),
    inputs: dict | None = None,
) -> torch.Tensor:
    """Continue prompt [B, T] by up to ``max_new_tokens``; returns prompt + new tokens [B, T + n].

    ``inputs``: keyword inputs of the model's forward on the prefill step only (a vision-language model's images,
    whose features then live in the cache).

    All prompts share one length (no padding). A row finishes at its first token among ``eos_id`` and
    ``stop_ids`` and repeats that token from then on; decoding ends early once every row has finished.
    """
    B, T = prompt.shape
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens == 0:
        return prompt
    stops = sorted({*stop_ids, *([] if eos_id is None else [eos_id])})
    stop_t = torch.tensor(stops, dtype=torch.long, device=prompt.device)
    cache = model.make_cache(B, T + max_new_tokens)
    positions = torch.arange(T, device=prompt.device).expand(B, T)
    logits = model(prompt, positions, cache, **(inputs or {}))[:, -1]
    out = [prompt]
    done = torch.zeros(B, dtype=torch.bool, device=prompt.device)
    for step in range(max_new_tokens):
        token = sample_next(logits, temperature, top_k, top_p, generator)
        if stops:
            token = torch.where(done, out[-1][:, -1], token)
            done |= torch.isin(token, stop_t)
        out.append(token[:, None])
        if step == max_new_tokens - 1 or (stops and bool(done.all())):
            break
        positions = torch.full((B, 1), T + step, device=prompt.device)
        logits = model(token[:, None], positions, cache)[:, -1]
    return torch.cat(out, dim=1)
