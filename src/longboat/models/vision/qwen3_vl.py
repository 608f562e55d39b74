"""The Qwen3-VL vision tower: image patches to merged tokens, plus DeepStack features of early blocks, as plain PyTorch.

Patches (rows of ``C·T·P·P`` pixels, in merge-block order, from ``data.images.qwen_vl``) are embedded by one linear
map with a bias (the checkpoint's 3-D convolution, flattened), plus a learned square table of position embeddings
resampled bilinearly (corners aligned) to each image's patch grid, rotated by 2-D rotary positions (row and column),
and run through pre-LayerNorm blocks with GELU MLPs attending over each frame of each image (no windows). The patch
merger turns each merge block's patches into one token of ``out_dim``; after each of the ``deepstack_layers`` a
merger of its own (normed after concatenating the block's patches) gives that block's features at the same tokens,
which the decoder adds to its hidden states after its first layers (DeepStack). Equal to transformers'
``Qwen3VLVisionModel``; weights convert to and from the checkpoints' ``model.visual.*`` tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from longboat.config.base import StrictModel
from longboat.models.llm.hf.adapter import HFConversionError, NameMap
from longboat.models.vision.qwen2_5_vl import Segments, VisionLayout, rotate, tower_from_hf, tower_to_hf

ACTIVATIONS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}


class Qwen3VisionConfig(StrictModel):
    d_model: int = Field(default=1152, gt=0)
    n_layers: int = Field(default=27, gt=0)
    n_heads: int = Field(default=16, gt=0)
    ffn_dim: int = Field(default=4304, gt=0)
    out_dim: int = Field(default=3584, gt=0, description="the language model's hidden size")
    in_channels: int = Field(default=3, gt=0)
    patch_size: int = Field(default=16, gt=0)
    temporal_patch_size: int = Field(default=2, gt=0)
    merge_size: int = Field(default=2, gt=0)
    num_position_embeddings: int = Field(default=2304, gt=0, description="a square table of learned positions")
    deepstack_layers: tuple[int, ...] = Field(default=(8, 16, 24), description="blocks whose features DeepStack adds")
    hidden_act: str = Field(default="gelu_pytorch_tanh", description="gelu_pytorch_tanh or gelu")
    rope_theta: float = Field(default=10000.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> Qwen3VisionConfig:
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 4:
            raise ValueError(f"d_model / n_heads ({self.d_model} / {self.n_heads}) must be a multiple of 4 "
                             "(2-D rotary positions)")
        if int(self.num_position_embeddings**0.5) ** 2 != self.num_position_embeddings:
            raise ValueError(f"num_position_embeddings ({self.num_position_embeddings}) must be a square")
        if bad := [i for i in self.deepstack_layers if not 0 <= i < self.n_layers]:
            raise ValueError(f"deepstack_layers {bad} are outside the {self.n_layers} layers")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        return self

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


def config_from_hf(vision: dict, out_dim: int | None = None) -> Qwen3VisionConfig:
    """Our config from a checkpoint's ``vision_config`` (``out_dim`` defaults to its ``out_hidden_size``)."""
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ACTIVATIONS:
        raise HFConversionError(f"config.json vision_config.hidden_act={act!r} is not supported "
                                f"({', '.join(ACTIVATIONS)})")
    rope = vision.get("rope_parameters") or {}
    if rope.get("rope_type", "axial") != "axial":
        raise HFConversionError(f"config.json vision_config.rope_parameters.rope_type={rope['rope_type']!r} is not "
                                "supported (axial)")
    return Qwen3VisionConfig(
        d_model=vision["hidden_size"], n_layers=vision["depth"], n_heads=vision["num_heads"],
        ffn_dim=vision["intermediate_size"], out_dim=out_dim or vision["out_hidden_size"],
        in_channels=vision.get("in_channels", 3), patch_size=vision["patch_size"],
        temporal_patch_size=vision.get("temporal_patch_size", 2), merge_size=vision.get("spatial_merge_size", 2),
        num_position_embeddings=vision["num_position_embeddings"],
        deepstack_layers=tuple(vision.get("deepstack_visual_indexes", ())), hidden_act=act,
        rope_theta=rope.get("rope_theta", 10000.0))


def config_to_hf(cfg: Qwen3VisionConfig) -> dict:
    """The checkpoint's ``vision_config`` for our config."""
    return {"depth": cfg.n_layers, "hidden_size": cfg.d_model, "hidden_act": cfg.hidden_act,
            "intermediate_size": cfg.ffn_dim, "num_heads": cfg.n_heads, "in_channels": cfg.in_channels,
            "out_hidden_size": cfg.out_dim, "patch_size": cfg.patch_size, "spatial_merge_size": cfg.merge_size,
            "temporal_patch_size": cfg.temporal_patch_size, "num_position_embeddings": cfg.num_position_embeddings,
            "deepstack_visual_indexes": list(cfg.deepstack_layers),
            "rope_parameters": {"rope_type": "axial", "rope_theta": cfg.rope_theta}}


class Attention(nn.Module):
    def __init__(self, cfg: Qwen3VisionConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.n_heads, -1)).unbind(1)
        return self.proj(segments.attention(rotate(q, cos, sin), rotate(k, cos, sin), v).flatten(1))


class Block(nn.Module):
    def __init__(self, cfg: Qwen3VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=1e-6)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=1e-6)
        self.fc1 = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.d_model)
        self.approximate = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate=self.approximate))


class Merger(nn.Module):
    """Each merge block's patches to one token of ``out_dim``: LayerNorm per patch (``after=False``, the final
    merger) or over the concatenated block (DeepStack's), then linear, GELU, linear."""

    def __init__(self, cfg: Qwen3VisionConfig, after: bool):
        super().__init__()
        self.hidden = cfg.d_model * cfg.merge_size**2
        self.after = after
        self.norm = nn.LayerNorm(self.hidden if after else cfg.d_model, eps=1e-6)
        self.fc1 = nn.Linear(self.hidden, self.hidden)
        self.fc2 = nn.Linear(self.hidden, cfg.out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.reshape(-1, self.hidden)) if self.after else self.norm(x).reshape(-1, self.hidden)
        return self.fc2(F.gelu(self.fc1(x)))


class Qwen3VisionTower(nn.Module):
    """(pixel_values [patches, C·T·P·P], grid_thw [images, 3]) -> (merged tokens [patches / merge², out_dim],
    DeepStack features: one such tensor per ``deepstack_layers`` entry)."""

    def __init__(self, cfg: Qwen3VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Linear(cfg.patch_dim, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.merger = Merger(cfg, after=False)
        self.deepstack = nn.ModuleList(Merger(cfg, after=True) for _ in cfg.deepstack_layers)
        self.register_buffer("inv_freq", torch.empty(cfg.d_model // cfg.n_heads // 4), persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Normal weights (std 0.02), zero biases, unit norms; valid after ``to_empty``."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The rotary frequencies, which no checkpoint holds, on the weights' device."""
        dim = self.cfg.d_model // self.cfg.n_heads // 2
        device = self.patch_embed.weight.device
        self.inv_freq = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))

    def positions(self, grid_thw: torch.Tensor) -> torch.Tensor:
        """The learned position table resampled to each image's grid, in merge-block order, repeated per frame."""
        side, m, d = int(self.cfg.num_position_embeddings**0.5), self.cfg.merge_size, self.cfg.d_model
        table = self.pos_embed.weight.T.reshape(1, d, side, side)
        out = []
        for t, h, w in grid_thw.tolist():
            grid = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0]  # [d, h, w]
            blocks = grid.view(d, h // m, m, w // m, m).permute(1, 3, 2, 4, 0).reshape(h * w, d)
            out.append(blocks.repeat(t, 1))
        return torch.cat(out)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        cfg = self.cfg
        layout = VisionLayout(grid_thw, cfg, windows=False)
        if pixel_values.shape != (len(layout.positions), cfg.patch_dim):
            raise ValueError(f"pixel_values {tuple(pixel_values.shape)} do not match the grids: expected "
                             f"({len(layout.positions)}, {cfg.patch_dim})")
        x = self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype))
        x = x + self.positions(grid_thw).to(x.dtype)
        angles = (layout.positions.to(x.device)[..., None].float() * self.inv_freq).flatten(1)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        frames = Segments(layout.frame_bounds, x.device)
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frames)
            if i in cfg.deepstack_layers:
                deepstack.append(self.deepstack[cfg.deepstack_layers.index(i)](x))
        return self.merger(x), deepstack


def _names(prefix: str) -> NameMap:
    return NameMap([
        (f"{prefix}blocks.{{i}}.norm1.{{p}}", "blocks.{i}.norm1.{p}"),
        (f"{prefix}blocks.{{i}}.norm2.{{p}}", "blocks.{i}.norm2.{p}"),
        (f"{prefix}blocks.{{i}}.attn.qkv.{{p}}", "blocks.{i}.attn.qkv.{p}"),
        (f"{prefix}blocks.{{i}}.attn.proj.{{p}}", "blocks.{i}.attn.proj.{p}"),
        (f"{prefix}blocks.{{i}}.mlp.linear_fc1.{{p}}", "blocks.{i}.fc1.{p}"),
        (f"{prefix}blocks.{{i}}.mlp.linear_fc2.{{p}}", "blocks.{i}.fc2.{p}"),
        (f"{prefix}merger.norm.{{p}}", "merger.norm.{p}"),
        (f"{prefix}merger.linear_fc1.{{p}}", "merger.fc1.{p}"),
        (f"{prefix}merger.linear_fc2.{{p}}", "merger.fc2.{p}"),
        (f"{prefix}deepstack_merger_list.{{i}}.norm.{{p}}", "deepstack.{i}.norm.{p}"),
        (f"{prefix}deepstack_merger_list.{{i}}.linear_fc1.{{p}}", "deepstack.{i}.fc1.{p}"),
        (f"{prefix}deepstack_merger_list.{{i}}.linear_fc2.{{p}}", "deepstack.{i}.fc2.{p}"),
        (f"{prefix}patch_embed.proj.{{p}}", "patch_embed.{p}"),
        (f"{prefix}pos_embed.weight", "pos_embed.weight"),
    ])


HF_PREFIX = "model.visual."


def state_dict_from_hf(hf: dict[str, torch.Tensor], prefix: str = HF_PREFIX) -> dict[str, torch.Tensor]:
    """Our tower's tensors from a checkpoint's ``{prefix}*`` tensors (others are left out; an unknown one fails)."""
    return tower_from_hf(hf, _names(prefix), prefix, "Qwen3-VL")


def state_dict_to_hf(sd: dict[str, torch.Tensor], cfg: Qwen3VisionConfig,
                     prefix: str = HF_PREFIX) -> dict[str, torch.Tensor]:
    """A checkpoint's ``{prefix}*`` tensors from our tower's (the patch embedding back to its 3-D kernel)."""
    return tower_to_hf(sd, _names(prefix), cfg)
