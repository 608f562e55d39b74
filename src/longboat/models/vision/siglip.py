"""The SigLIP vision tower as SmolVLM (Idefics3) uses it: our ViT with a final norm (SigLIP's ``post_layernorm``),
no pooling head, and learned positions read through SmolVLM's fractional bucketing, so that an image smaller than
the tower's square (padded, its patches marked in ``patch_mask``) still spans the whole position table.

Each patch row ``r`` of an image ``h`` patches high takes the position row of the bucket ``r / h`` falls in among the
table's ``grid`` rows (columns alike); padded patches take position 0 and are not attended to. For a full-size image
this is the identity. The weights map to and from the checkpoints' ``vision_model.*`` names (``hf_names``).
"""

from __future__ import annotations

import re

import torch
from pydantic import Field, model_validator

from longboat.models.vision.vit import ViT, ViTConfig


class SigLIPConfig(ViTConfig):
    image_size: int = Field(default=224, gt=0, description="the position table's square, in pixels; the largest "
                                                          "image the tower reads")
    final_norm: bool = Field(default=True, description="SigLIP's post_layernorm")

    @model_validator(mode="after")
    def _fits(self) -> SigLIPConfig:
        if self.image_size % self.patch_size:
            raise ValueError(f"vision.image_size ({self.image_size}) must be a multiple of vision.patch_size "
                             f"({self.patch_size})")
        return self

    @property
    def grid(self) -> int:
        """Patches per side of the position table (and of a full-size image)."""
        return self.image_size // self.patch_size


def bucket_positions(patch_mask: torch.Tensor, grid: int) -> torch.Tensor:
    """[B, h, w] valid patches -> [B, h·w] rows of the ``grid``² position table (SmolVLM's bucketing, in fp32)."""
    B, h, w = patch_mask.shape
    device = patch_mask.device
    edges = torch.arange(1 / grid, 1.0, 1 / grid, device=device)
    rows, cols = patch_mask[:, :, 0].sum(1), patch_mask[:, 0, :].sum(1)

    def bucket(n: int, valid: torch.Tensor) -> torch.Tensor:
        frac = torch.arange(n, device=device, dtype=torch.float32)[None, :] * (1.0 / valid)[:, None]
        return torch.bucketize(frac.clamp(max=1.0 - 1e-6), edges, right=True)

    ids = (bucket(h, rows)[:, :, None] * grid + bucket(w, cols)[:, None, :]).reshape(B, h * w)
    return torch.where(patch_mask.reshape(B, -1), ids, torch.zeros_like(ids))


def patch_mask_of(pixel_mask: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[B, H, W] valid pixels -> [B, H / patch, W / patch] patches holding at least one of them."""
    B, H, W = pixel_mask.shape
    return pixel_mask.reshape(B, H // patch_size, patch_size, W // patch_size, patch_size).bool().any(4).any(2)


class SigLIP(ViT):
    """[B, 3, H, W] images (H, W ≤ ``image_size``, multiples of the patch) -> [B, (H / patch)(W / patch), d_model]
    normed patch features; ``patch_mask`` [B, H / patch, W / patch] marks each image's patches (None: all)."""

    def __init__(self, cfg: SigLIPConfig):
        super().__init__(cfg, (3, cfg.image_size, cfg.image_size))
        self.grid = cfg.grid

    def forward(self, images: torch.Tensor, patch_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, _, H, W = images.shape
        p, size = self.cfg.patch_size, self.cfg.image_size
        if H % p or W % p or H > size or W > size:
            raise ValueError(f"images {H}x{W} must be at most {size}x{size} pixels and multiples of {p}")
        full = torch.ones(B, H // p, W // p, dtype=torch.bool, device=images.device)
        if patch_mask is not None and patch_mask.shape != full.shape:
            raise ValueError(f"patch_mask {tuple(patch_mask.shape)} must be {tuple(full.shape)} for these images")
        mask = full if patch_mask is None else patch_mask.bool()
        positions = bucket_positions(mask, self.grid)
        x = self.patch_embed(images).flatten(2).transpose(1, 2) + self.pos_embed[0, positions]
        attend = None if bool(mask.all()) else mask.reshape(B, 1, 1, -1)
        for block in self.blocks:
            x = block(x, attend)
        return self.norm(x) if self.norm is not None else x


HF_NAMES = [
    ("embeddings.patch_embedding.{p}", "patch_embed.{p}"),
    ("embeddings.position_embedding.weight", "pos_embed"),
    ("encoder.layers.{i}.layer_norm1.{p}", "blocks.{i}.norm1.{p}"),
    ("encoder.layers.{i}.layer_norm2.{p}", "blocks.{i}.norm2.{p}"),
    ("encoder.layers.{i}.self_attn.out_proj.{p}", "blocks.{i}.attn.proj.{p}"),
    ("encoder.layers.{i}.mlp.fc1.{p}", "blocks.{i}.mlp.0.{p}"),
    ("encoder.layers.{i}.mlp.fc2.{p}", "blocks.{i}.mlp.2.{p}"),
    ("post_layernorm.{p}", "norm.{p}"),
]
_QKV = re.compile(r"encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)")


def _regex(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(r"\{p\}", r"(?P<p>weight|bias)").replace(r"\{i\}", r"(?P<i>\d+)"))


def siglip_from_hf(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A SigLIP vision model's tensors (names after its ``vision_model.`` prefix) -> ours; an unknown one is a
    ``KeyError`` naming it."""
    out, qkv = {}, {}
    for name, value in sd.items():
        if m := _QKV.fullmatch(name):
            layer, which, param = m.groups()
            qkv.setdefault((layer, param), {})[which] = value
            continue
        for theirs, ours in HF_NAMES:
            if m := _regex(theirs).fullmatch(name):
                out[ours.format(**m.groupdict())] = value[None] if ours == "pos_embed" else value
                break
        else:
            raise KeyError(name)
    for (layer, param), parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise KeyError(f"encoder.layers.{layer}.self_attn.{min({'q', 'k', 'v'} - set(parts))}_proj.{param}")
        out[f"blocks.{layer}.attn.qkv.{param}"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out


def siglip_to_hf(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tower's tensors -> a SigLIP vision model's names (without its prefix)."""
    out = {}
    for name, value in sd.items():
        if m := re.fullmatch(r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)", name):
            for which, part in zip("qkv", value.chunk(3)):
                out[f"encoder.layers.{m[1]}.self_attn.{which}_proj.{m[2]}"] = part
            continue
        for theirs, ours in HF_NAMES:
            if m := _regex(ours).fullmatch(name):
                out[theirs.format(**m.groupdict())] = value[0] if ours == "pos_embed" else value
                break
        else:
            raise KeyError(name)
    return out
