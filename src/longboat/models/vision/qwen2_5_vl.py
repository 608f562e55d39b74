"""The Qwen2.5-VL vision tower: image patches to merged tokens for the language model, as plain PyTorch.

Patches (rows of ``C·T·P·P`` pixels from ``data.images.qwen_vl``) are embedded by one linear map (the checkpoint's
3-D convolution, flattened), rotated by 2-D rotary positions (row and column of each patch), and run through
pre-RMSNorm blocks with SwiGLU MLPs. Blocks attend within windows of ``window_size`` pixels, except the
``full_attention_layers``, which attend over each whole image; images never attend to each other. The 2×2 patch
merger turns each merge block's four patches into one token of ``out_dim``. Attention is exact
``scaled_dot_product_attention`` per window or image, those of one length run as one batch.
Weights convert to and from the ``visual.*`` tensors of Qwen2.5-VL checkpoints (``state_dict_from_hf``).
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from longboat.config.base import StrictModel
from longboat.models.llm.hf.adapter import HFConversionError, NameMap


class Qwen2_5_VisionConfig(StrictModel):
    d_model: int = Field(default=1280, gt=0)
    n_layers: int = Field(default=32, gt=0)
    n_heads: int = Field(default=16, gt=0)
    ffn_dim: int = Field(default=3420, gt=0)
    out_dim: int = Field(default=3584, gt=0, description="the language model's hidden size")
    in_channels: int = Field(default=3, gt=0)
    patch_size: int = Field(default=14, gt=0)
    temporal_patch_size: int = Field(default=2, gt=0)
    merge_size: int = Field(default=2, gt=0)
    window_size: int = Field(default=112, gt=0, description="side of an attention window, in pixels")
    full_attention_layers: tuple[int, ...] = (7, 15, 23, 31)
    rope_theta: float = Field(default=10000.0, gt=0)
    norm_eps: float = Field(default=1e-6, gt=0)

    @model_validator(mode="after")
    def _check(self) -> Qwen2_5_VisionConfig:
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 4:
            raise ValueError(f"d_model / n_heads ({self.d_model} / {self.n_heads}) must be a multiple of 4 "
                             "(2-D rotary positions)")
        if self.window_size // self.merge_size // self.patch_size < 1:
            raise ValueError(f"window_size ({self.window_size}) must cover at least one merged token "
                             f"({self.merge_size * self.patch_size} pixels)")
        if bad := [i for i in self.full_attention_layers if not 0 <= i < self.n_layers]:
            raise ValueError(f"full_attention_layers {bad} are outside the {self.n_layers} layers")
        return self

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def window_tokens(self) -> int:
        """Side of a window in merged tokens."""
        return self.window_size // self.merge_size // self.patch_size


def config_from_hf(vision: dict, out_dim: int | None = None) -> Qwen2_5_VisionConfig:
    """Our config from a checkpoint's ``vision_config`` (``out_dim`` defaults to its ``out_hidden_size``)."""
    act = vision.get("hidden_act", "silu")
    if act != "silu":
        raise HFConversionError(f"vision_config.hidden_act={act!r}: the Qwen2.5-VL tower has a SiLU MLP")
    rope = vision.get("rope_parameters") or {}
    if rope.get("rope_type", "axial") != "axial":
        raise HFConversionError(f"vision_config.rope_parameters.rope_type={rope['rope_type']!r}: only axial")
    return Qwen2_5_VisionConfig(
        d_model=vision["hidden_size"], n_layers=vision["depth"], n_heads=vision["num_heads"],
        ffn_dim=vision["intermediate_size"], out_dim=out_dim or vision["out_hidden_size"],
        in_channels=vision.get("in_channels", vision.get("in_chans", 3)), patch_size=vision["patch_size"],
        temporal_patch_size=vision.get("temporal_patch_size", 2), merge_size=vision.get("spatial_merge_size", 2),
        window_size=vision["window_size"], full_attention_layers=tuple(vision["fullatt_block_indexes"]),
        rope_theta=rope.get("rope_theta", 10000.0))


def config_to_hf(cfg: Qwen2_5_VisionConfig) -> dict:
    """The checkpoint's ``vision_config`` for our config."""
    return {"depth": cfg.n_layers, "hidden_size": cfg.d_model, "hidden_act": "silu", "intermediate_size": cfg.ffn_dim,
            "num_heads": cfg.n_heads, "in_chans": cfg.in_channels, "in_channels": cfg.in_channels,
            "out_hidden_size": cfg.out_dim, "patch_size": cfg.patch_size, "spatial_patch_size": cfg.patch_size,
            "spatial_merge_size": cfg.merge_size, "temporal_patch_size": cfg.temporal_patch_size,
            "window_size": cfg.window_size, "fullatt_block_indexes": list(cfg.full_attention_layers),
            "rope_parameters": {"rope_type": "axial", "rope_theta": cfg.rope_theta}}


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 whatever the input dtype, as Qwen's."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)  # gate
        self.w2 = nn.Linear(hidden, dim)  # down
        self.w3 = nn.Linear(dim, hidden)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions applied in float32 (``x`` [S, H, D], ``cos``/``sin`` [S, D])."""
    h = x.float()
    h1, h2 = h.chunk(2, dim=-1)
    return (h * cos[:, None] + torch.cat((-h2, h1), dim=-1) * sin[:, None]).to(x.dtype)


class Segments:
    """Rows of a sequence cut into segments (windows or images), grouped by length so that each group is one batch."""

    def __init__(self, bounds: list[int], device: torch.device | str = "cpu"):
        starts_by_length: dict[int, list[int]] = defaultdict(list)
        for start, end in zip(bounds[:-1], bounds[1:]):
            if end > start:
                starts_by_length[end - start].append(start)
        self.whole = len(bounds) == 2  # one segment: the whole sequence, no gather
        self.groups = [(len(starts), length, (torch.tensor(starts)[:, None] + torch.arange(length)).flatten())
                       for length, starts in starts_by_length.items()]
        self.groups = [(n, length, rows.to(device)) for n, length, rows in self.groups]

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``scaled_dot_product_attention`` of [S, H, D] tensors within each segment."""
        if self.whole:
            return F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v))).transpose(0, 1)
        out = torch.empty_like(q)
        for n, length, rows in self.groups:
            batch = [t[rows].unflatten(0, (n, length)).transpose(1, 2) for t in (q, k, v)]  # [n, H, L, D]
            out[rows] = F.scaled_dot_product_attention(*batch).transpose(1, 2).flatten(0, 1)
        return out


class Attention(nn.Module):
    def __init__(self, cfg: Qwen2_5_VisionConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.n_heads, -1)).unbind(1)
        out = segments.attention(rotate(q, cos, sin), rotate(k, cos, sin), v)
        return self.proj(out.flatten(1))


class Block(nn.Module):
    def __init__(self, cfg: Qwen2_5_VisionConfig):
        super().__init__()
        self.norm1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.ffn_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Each merge block's ``merge_size²`` patch features, normed and concatenated, to one token of ``out_dim``."""

    def __init__(self, cfg: Qwen2_5_VisionConfig):
        super().__init__()
        hidden = cfg.d_model * cfg.merge_size**2
        self.norm = RMSNorm(cfg.d_model, 1e-6)
        self.fc1 = nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, cfg.out_dim)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.norm(x).view(-1, self.hidden))))


class VisionLayout:
    """What attention needs of a batch's grids: patch positions, window order, window and image bounds.

    Patches arrive in merge-block order per image; the tower reorders whole merge blocks so that each window's are
    contiguous (``order``: merge-block indices in window order), and the merger's output is put back afterwards."""

    def __init__(self, grid_thw: torch.Tensor, cfg, windows: bool = True):
        """``windows=False``: one window per frame (Qwen3-VL's tower), so ``order`` keeps the patches' order and
        ``frame_bounds`` (the window bounds then) cut the sequence into frames."""
        m, unit = cfg.merge_size, cfg.merge_size**2
        positions, order, bounds, images = [], [], [0], [0]
        offset = 0
        for t, h, w in grid_thw.tolist():
            if h % m or w % m:
                raise ValueError(f"grid {h}x{w} does not divide into {m}x{m} merge blocks")
            lh, lw = h // m, w // m
            rows = torch.arange(h).view(lh, m, 1, 1).expand(lh, m, lw, m).transpose(1, 2).flatten()
            cols = torch.arange(w).view(1, 1, lw, m).expand(lh, m, lw, m).transpose(1, 2).flatten()
            positions.append(torch.stack([rows, cols], dim=-1).repeat(t, 1))
            blocks = torch.arange(t * lh * lw).view(t, lh, lw) + offset
            ws = cfg.window_tokens if windows else max(lh, lw)
            for frame in range(t):
                for r in range(0, lh, ws):
                    for c in range(0, lw, ws):
                        window = blocks[frame, r:r + ws, c:c + ws].flatten()
                        order.append(window)
                        bounds.append(bounds[-1] + window.numel() * unit)
                images.append(images[-1] + h * w)
            offset += t * lh * lw
        self.order = torch.cat(order)
        self.restore = torch.argsort(self.order)
        self.window_bounds, self.image_bounds = bounds, images
        self.frame_bounds = bounds
        self.positions = torch.cat(positions).view(-1, unit, 2)[self.order].view(-1, 2)  # [S, (row, col)]

    def permute(self, x: torch.Tensor, unit: int) -> torch.Tensor:
        """Rows of ``x`` (merge-block order) in window order."""
        return x.view(-1, unit, *x.shape[1:])[self.order.to(x.device)].flatten(0, 1)


class Qwen2_5_VisionTower(nn.Module):
    """(pixel_values [patches, C·T·P·P], grid_thw [images, 3]) -> merged tokens [patches / merge², out_dim]."""

    def __init__(self, cfg: Qwen2_5_VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Linear(cfg.patch_dim, cfg.d_model, bias=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.merger = PatchMerger(cfg)
        rope_dim = cfg.d_model // cfg.n_heads // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float) / rope_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Normal weights (std 0.02), zero biases, unit norms; valid after ``to_empty``."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The rotary frequencies, which no checkpoint holds, on the weights' device (after a meta-device build)."""
        rope_dim = self.cfg.d_model // self.cfg.n_heads // 2
        device = self.patch_embed.weight.device
        self.inv_freq = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float,
                                                                    device=device) / rope_dim))

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [S, head_dim] of (row, col) positions: rows rotate the first half of each half, columns the
        second."""
        freqs = positions[..., None].float() * self.inv_freq  # [S, 2, head_dim / 4]
        angles = freqs.flatten(1)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        cfg, unit = self.cfg, self.cfg.merge_size**2
        layout = VisionLayout(grid_thw, cfg)
        if pixel_values.shape != (len(layout.positions), cfg.patch_dim):
            raise ValueError(f"pixel_values {tuple(pixel_values.shape)} do not match the grids: expected "
                             f"({len(layout.positions)}, {cfg.patch_dim})")
        weight = self.patch_embed.weight
        x = layout.permute(self.patch_embed(pixel_values.to(weight.dtype)), unit)
        cos, sin = self.rotary(layout.positions.to(x.device))
        windows, images = Segments(layout.window_bounds, x.device), Segments(layout.image_bounds, x.device)
        full = set(cfg.full_attention_layers)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, images if i in full else windows)
        return self.merger(x)[layout.restore.to(x.device)]


def _names(prefix: str) -> NameMap:
    return NameMap([
        (f"{prefix}blocks.{{i}}.norm1.weight", "blocks.{i}.norm1.weight"),
        (f"{prefix}blocks.{{i}}.norm2.weight", "blocks.{i}.norm2.weight"),
        (f"{prefix}blocks.{{i}}.attn.qkv.{{p}}", "blocks.{i}.attn.qkv.{p}"),
        (f"{prefix}blocks.{{i}}.attn.proj.{{p}}", "blocks.{i}.attn.proj.{p}"),
        (f"{prefix}blocks.{{i}}.mlp.gate_proj.{{p}}", "blocks.{i}.mlp.w1.{p}"),
        (f"{prefix}blocks.{{i}}.mlp.down_proj.{{p}}", "blocks.{i}.mlp.w2.{p}"),
        (f"{prefix}blocks.{{i}}.mlp.up_proj.{{p}}", "blocks.{i}.mlp.w3.{p}"),
        (f"{prefix}merger.ln_q.weight", "merger.norm.weight"),
        (f"{prefix}merger.mlp.0.{{p}}", "merger.fc1.{p}"),
        (f"{prefix}merger.mlp.2.{{p}}", "merger.fc2.{p}"),
        (f"{prefix}patch_embed.proj.weight", "patch_embed.weight"),
    ])


HF_PREFIX = "visual."  # Qwen2.5-VL checkpoints; transformers' own modules name it ``model.visual.``


def state_dict_from_hf(hf: dict[str, torch.Tensor], prefix: str = HF_PREFIX) -> dict[str, torch.Tensor]:
    """Our tower's tensors from a checkpoint's ``{prefix}*`` tensors (others are left out; an unknown one fails)."""
    return tower_from_hf(hf, _names(prefix), prefix, "Qwen2.5-VL")


def state_dict_to_hf(sd: dict[str, torch.Tensor], cfg: Qwen2_5_VisionConfig,
                     prefix: str = HF_PREFIX) -> dict[str, torch.Tensor]:
    """A checkpoint's ``{prefix}*`` tensors from our tower's (the patch embedding back to its 3-D kernel)."""
    return tower_to_hf(sd, _names(prefix), cfg)


def tower_from_hf(hf: dict[str, torch.Tensor], names, prefix: str, family: str) -> dict[str, torch.Tensor]:
    """A Qwen-VL tower's tensors renamed by ``names`` from the checkpoint's ``{prefix}*`` ones, the 3-D patch kernel
    flattened (shared by the Qwen2.5-VL and Qwen3-VL towers)."""
    ours = {}
    for name, tensor in hf.items():
        if not name.startswith(prefix):
            continue
        target = names.from_hf(name)
        if target is None:
            raise HFConversionError(f"unknown vision tensor {name!r} (not part of the {family} vision tower)")
        ours[target] = tensor.flatten(1) if target == "patch_embed.weight" else tensor
    return ours


def tower_to_hf(sd: dict[str, torch.Tensor], names, cfg) -> dict[str, torch.Tensor]:
    """The reverse of :func:`tower_from_hf`: checkpoint names, the patch embedding back to its 3-D kernel."""
    hf = {}
    kernel = (cfg.d_model, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
    for name, tensor in sd.items():
        target = names.to_hf(name)
        if target is None:
            raise HFConversionError(f"no checkpoint name for vision tensor {name!r}")
        hf[target] = tensor.reshape(kernel) if name == "patch_embed.weight" else tensor
    return hf
