"""The ERNIE-4.5-VL vision tower and its resampler: image patches to the decoder's tokens, as plain PyTorch.

Patches (rows of ``C·P·P`` pixels, in merge-block order, one row per patch of each frame) are embedded by one linear
map without bias, rotated by 2-D rotary positions (row and column, as Qwen's towers), and run through
pre-LayerNorm blocks with quick-GELU MLPs attending over each frame; a final LayerNorm ends the tower. The
resampler turns each merge block's ``merge_size²`` patches into one token: a spatial MLP (linear, GELU, linear,
LayerNorm) of the concatenated block, then a temporal MLP of two frames' tokens side by side (an image's one frame
twice; a video's even frames beside its odd ones), a linear map to the decoder's width and an RMSNorm. Equal to
transformers' ``Ernie4_5_VLMoeVisionTransformerPretrainedModel`` followed by its
``Ernie4_5_VLMoeVariableResolutionResamplerModel``; weights convert to and from the checkpoints'
``model.vision_model.*`` and ``model.resampler_model.*`` tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from longboat.config.base import StrictModel
from longboat.models.llm.hf.adapter import HFConversionError, NameMap
from longboat.models.vision.qwen2_5_vl import Segments, VisionLayout, rotate

ACTIVATIONS = {"quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "gelu": F.gelu}


class Ernie4_5VisionConfig(StrictModel):
    d_model: int = Field(default=1280, gt=0)
    n_layers: int = Field(default=32, gt=0)
    n_heads: int = Field(default=16, gt=0)
    ffn_dim: int = Field(default=5120, gt=0)
    out_dim: int = Field(default=2560, gt=0, description="the language model's hidden size")
    in_channels: int = Field(default=3, gt=0)
    patch_size: int = Field(default=14, gt=0)
    merge_size: int = Field(default=2, gt=0)
    hidden_act: str = Field(default="quick_gelu", description="quick_gelu or gelu")
    norm_eps: float = Field(default=1e-6, gt=0, description="the tower's and the resampler's LayerNorms")
    out_norm_eps: float = Field(default=1e-5, gt=0, description="the resampler's final RMSNorm (the decoder's eps)")
    rope_theta: float = Field(default=10000.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> Ernie4_5VisionConfig:
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 4:
            raise ValueError(f"d_model / n_heads ({self.d_model} / {self.n_heads}) must be a multiple of 4 "
                             "(2-D rotary positions)")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        return self

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.patch_size**2


def config_from_hf(vision: dict, text: dict) -> Ernie4_5VisionConfig:
    """Our config from a checkpoint's ``vision_config`` and ``text_config`` (the resampler's width and norm)."""
    act = vision.get("hidden_act", "quick_gelu")
    if act not in ACTIVATIONS:
        raise HFConversionError(f"config.json vision_config.hidden_act={act!r} is not supported "
                                f"({', '.join(ACTIVATIONS)})")
    rope = vision.get("rope_parameters") or {}
    if rope.get("rope_type", "axial") != "axial":
        raise HFConversionError(f"config.json vision_config.rope_parameters.rope_type={rope['rope_type']!r} is not "
                                "supported (axial)")
    if vision.get("temporal_merge_size", 2) != 2:
        raise HFConversionError(f"config.json vision_config.temporal_merge_size={vision['temporal_merge_size']!r} "
                                "is not supported: the resampler pairs frames (2)")
    return Ernie4_5VisionConfig(
        d_model=vision["hidden_size"], n_layers=vision["depth"], n_heads=vision["num_heads"],
        ffn_dim=vision["intermediate_size"], out_dim=text["hidden_size"], in_channels=vision.get("in_channels", 3),
        patch_size=vision["patch_size"], merge_size=vision.get("spatial_merge_size", 2), hidden_act=act,
        norm_eps=vision.get("rms_norm_eps", 1e-6), out_norm_eps=text.get("rms_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", 10000.0))


def config_to_hf(cfg: Ernie4_5VisionConfig) -> dict:
    """The checkpoint's ``vision_config`` for our config (``out_dim`` and ``out_norm_eps`` are the decoder's)."""
    return {"depth": cfg.n_layers, "hidden_size": cfg.d_model, "hidden_act": cfg.hidden_act,
            "intermediate_size": cfg.ffn_dim, "num_heads": cfg.n_heads, "in_channels": cfg.in_channels,
            "patch_size": cfg.patch_size, "spatial_merge_size": cfg.merge_size, "temporal_merge_size": 2,
            "rms_norm_eps": cfg.norm_eps, "rope_parameters": {"rope_type": "axial", "rope_theta": cfg.rope_theta}}


class Attention(nn.Module):
    def __init__(self, cfg: Ernie4_5VisionConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.n_heads, -1)).unbind(1)
        return self.proj(segments.attention(rotate(q, cos, sin), rotate(k, cos, sin), v).flatten(1))


class Block(nn.Module):
    def __init__(self, cfg: Ernie4_5VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.fc1 = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.d_model)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class MLP(nn.Module):
    """Linear, GELU, linear, LayerNorm: the resampler's spatial and temporal steps."""

    def __init__(self, d_in: int, d_out: int, eps: float):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_out)
        self.fc2 = nn.Linear(d_out, d_out)
        self.norm = nn.LayerNorm(d_out, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc2(F.gelu(self.fc1(x))))


class Resampler(nn.Module):
    """(patch features [patches, d] in merge-block order, grid_thw) -> tokens [blocks of frame pairs, out_dim]."""

    def __init__(self, cfg: Ernie4_5VisionConfig):
        super().__init__()
        self.unit = cfg.merge_size**2
        hidden = cfg.d_model * self.unit
        self.spatial = MLP(hidden, hidden, cfg.norm_eps)
        self.temporal = MLP(2 * hidden, hidden, cfg.norm_eps)
        self.proj = nn.Linear(hidden, cfg.out_dim)
        self.norm = nn.RMSNorm(cfg.out_dim, eps=cfg.out_norm_eps)

    def forward(self, x: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        x = self.spatial(x.reshape(-1, x.shape[-1] * self.unit))
        pairs, start = [], 0
        for t, h, w in grid_thw.tolist():
            frames = x[start:start + t * h * w // self.unit].unflatten(0, (t, -1))
            start += t * h * w // self.unit
            first, second = (frames, frames) if t == 1 else (frames[0::2], frames[1::2])
            n = min(len(first), len(second))  # an odd video's last frame has no pair
            pairs.append(torch.cat([first[:n], second[:n]], dim=-1).flatten(0, 1))
        return self.norm(self.proj(self.temporal(torch.cat(pairs))).float()).to(x.dtype)


class Ernie4_5VisionTower(nn.Module):
    """(pixel_values [patches, C·P·P], grid_thw [images, 3]) -> the decoder's tokens [patches / merge², out_dim]
    for images (a video's frames are paired: half as many)."""

    def __init__(self, cfg: Ernie4_5VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Linear(cfg.patch_dim, cfg.d_model, bias=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.resampler = Resampler(cfg)
        self.register_buffer("inv_freq", torch.empty(cfg.d_model // cfg.n_heads // 4), persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Normal weights (std 0.02), zero biases, unit norms; valid after ``to_empty``."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The rotary frequencies, which no checkpoint holds, on the weights' device."""
        dim = self.cfg.d_model // self.cfg.n_heads // 2
        device = self.patch_embed.weight.device
        self.inv_freq = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        layout = VisionLayout(grid_thw, cfg, windows=False)
        if pixel_values.shape != (len(layout.positions), cfg.patch_dim):
            raise ValueError(f"pixel_values {tuple(pixel_values.shape)} do not match the grids: expected "
                             f"({len(layout.positions)}, {cfg.patch_dim})")
        x = self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype))
        angles = (layout.positions.to(x.device)[..., None].float() * self.inv_freq).flatten(1)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        frames = Segments(layout.frame_bounds, x.device)
        for block in self.blocks:
            x = block(x, cos, sin, frames)
        return self.resampler(self.ln(x), grid_thw)


VISION_PREFIX, RESAMPLER_PREFIX = "model.vision_model.", "model.resampler_model."
NAMES = NameMap([
    (VISION_PREFIX + "blocks.{i}.norm1.{p}", "blocks.{i}.norm1.{p}"),
    (VISION_PREFIX + "blocks.{i}.norm2.{p}", "blocks.{i}.norm2.{p}"),
    (VISION_PREFIX + "blocks.{i}.attn.qkv.{p}", "blocks.{i}.attn.qkv.{p}"),
    (VISION_PREFIX + "blocks.{i}.attn.proj.{p}", "blocks.{i}.attn.proj.{p}"),
    (VISION_PREFIX + "blocks.{i}.mlp.fc1.{p}", "blocks.{i}.fc1.{p}"),
    (VISION_PREFIX + "blocks.{i}.mlp.fc2.{p}", "blocks.{i}.fc2.{p}"),
    (VISION_PREFIX + "ln.{p}", "ln.{p}"),
    (VISION_PREFIX + "patch_embed.proj.weight", "patch_embed.weight"),
    (RESAMPLER_PREFIX + "spatial_linear.0.{p}", "resampler.spatial.fc1.{p}"),
    (RESAMPLER_PREFIX + "spatial_linear.2.{p}", "resampler.spatial.fc2.{p}"),
    (RESAMPLER_PREFIX + "spatial_linear.3.{p}", "resampler.spatial.norm.{p}"),
    (RESAMPLER_PREFIX + "temporal_linear.0.{p}", "resampler.temporal.fc1.{p}"),
    (RESAMPLER_PREFIX + "temporal_linear.2.{p}", "resampler.temporal.fc2.{p}"),
    (RESAMPLER_PREFIX + "temporal_linear.3.{p}", "resampler.temporal.norm.{p}"),
    (RESAMPLER_PREFIX + "mlp.{p}", "resampler.proj.{p}"),
    (RESAMPLER_PREFIX + "after_norm.weight", "resampler.norm.weight"),
])


def is_tower_tensor(name: str) -> bool:
    return name.startswith((VISION_PREFIX, RESAMPLER_PREFIX))


def state_dict_from_hf(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tower's tensors from a checkpoint's tower and resampler tensors (others are left out; an unknown one
    fails)."""
    ours = {}
    for name, tensor in hf.items():
        if not is_tower_tensor(name):
            continue
        target = NAMES.from_hf(name)
        if target is None:
            raise HFConversionError(f"unknown vision tensor {name!r} (not part of the ERNIE-4.5-VL tower)")
        ours[target] = tensor
    return ours


def state_dict_to_hf(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's tower and resampler tensors from our tower's."""
    hf = {}
    for name, tensor in sd.items():
        target = NAMES.to_hf(name)
        if target is None:
            raise HFConversionError(f"no checkpoint name for vision tensor {name!r}")
        hf[target] = tensor
    return hf
