"""Rotary position embeddings (RoFormer) with optional Llama-3.1 or YaRN frequency scaling.

The rotation pairs dimension i with i + head_dim/2 (the "rotate half" layout used by HF checkpoints),
so Llama/Qwen weights load without permuting wq/wk. Multimodal RoPE (``mrope_axes``, ``mrope_tables``) reads
each frequency's angle from one of three position rows (time, height, width).
"""

from __future__ import annotations

import math

import torch

from longboat.models.llm.config import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """theta^(-2i/d) for i < d/2, optionally rescaled as in Llama 3.1 or YaRN."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    if scaling is None:
        return inv_freq
    if scaling.type == "yarn":
        return _yarn_frequencies(head_dim, theta, scaling)
    old_len = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (> old_len / low_freq_factor) are divided by the factor, short ones
    # (< old_len / high_freq_factor) are kept, and the band in between is blended linearly.
    scaled = torch.where(wavelen > old_len / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= old_len / scaling.high_freq_factor) & (wavelen <= old_len / scaling.low_freq_factor)
    return torch.where(medium, blended, scaled)


def _yarn_frequencies(head_dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """YaRN's "NTK-by-parts": frequency pairs that rotate more than beta_fast times over the original context keep
    their frequency, those rotating fewer than beta_slow times are divided by the factor, a linear ramp between."""

    def dim_of(rotations: float) -> float:  # the (fractional) pair index that rotates ``rotations`` times
        ratio = s.original_max_position_embeddings / (rotations * 2 * math.pi)
        return head_dim * math.log(ratio) / (2 * math.log(theta))

    low, high = dim_of(s.beta_fast or 32), dim_of(s.beta_slow or 1)
    if s.truncate is not False:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a step instead of a ramp, without dividing by zero
    kept = 1 - ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    powers = theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    return 1.0 / (s.factor * powers) * (1 - kept) + 1.0 / powers * kept


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(scaling: RopeScaling | None) -> float:
    """What YaRN multiplies cos and sin by (so q·k of the rotated parts by its square); 1 without YaRN."""
    if scaling is None or scaling.type != "yarn":
        return 1.0
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:
        return _yarn_mscale(scaling.factor, scaling.mscale) / _yarn_mscale(scaling.factor, scaling.mscale_all_dim)
    return _yarn_mscale(scaling.factor)


def softmax_scale_factor(scaling: RopeScaling | None) -> float:
    """DeepSeek's YaRN correction of the attention softmax scale, mscale(factor, mscale_all_dim)^2; 1 otherwise."""
    if scaling is None or scaling.type != "yarn" or not scaling.mscale_all_dim:
        return 1.0
    return _yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2


def rope_tables(
    max_len: int, head_dim: int, theta: float, scaling: RopeScaling | None = None, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-folded sin of position × frequency, each [max_len, head_dim] in fp32, times YaRN's
    ``attention_factor``.

    Dimension i and i + head_dim/2 share a frequency; the sin table is (-sin, sin) so that
    ``apply_rope`` needs one roll instead of splitting, negating and concatenating halves.
    """
    inv_freq = inverse_frequencies(head_dim, theta, scaling).to(device)
    angles = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv_freq)
    magnitude = attention_factor(scaling)
    cos, sin = angles.cos() * magnitude, angles.sin() * magnitude
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, heads, head_dim] by tables from ``rope_tables`` indexed to [T or B×T, head_dim].

    With x = (x1, x2): (x1·cos - x2·sin, x2·cos + x1·sin) = x·cos + roll(x, head_dim/2)·(-sin, sin).
    """
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def mrope_axes(head_dim: int, section: tuple[int, int, int], interleaved: bool = False,
               alternating: bool = False) -> torch.Tensor:
    """[head_dim]: which position row (0 time, 1 height, 2 width) each rotary dimension reads.

    Consecutive (Qwen2.5-VL): the first ``section[0]`` frequencies read row 0, the next ``section[1]`` row 1, the
    rest row 2. Interleaved (Qwen3-VL): frequency i reads row i mod 3 while i < 3·section[row], else row 0.
    Alternating (ERNIE-4.5-VL, its adjacent-pair rotation in rotate-half order): frequency i < section[1] +
    section[2] reads row 1 when i is even and row 2 when odd; the last ``section[0]`` read row 0.
    """
    half = head_dim // 2
    if alternating:
        axes = [1 + i % 2 for i in range(section[1] + section[2])] + [0] * section[0]
    elif interleaved:
        axes = [i % 3 if i % 3 and i < 3 * section[i % 3] else 0 for i in range(half)]
    else:
        axes = [row for row, n in enumerate(section) for _ in range(n)]
    axes = torch.tensor(axes, dtype=torch.long, device="cpu")  # also under a meta-device build
    return torch.cat((axes, axes))


def mrope_tables(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, axes: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B, T, head_dim] for positions [3, B, T] from ``rope_tables``, each dimension from its row."""
    index = axes.to(positions.device).view(1, 1, 1, -1).expand(1, *positions.shape[1:], -1)
    return cos[positions].gather(0, index).squeeze(0), sin[positions].gather(0, index).squeeze(0)
