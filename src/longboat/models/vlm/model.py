"""A vision-language model composed of registry parts: tower → projector → image features in the decoder's input.

The tower encodes the batch's images, the projector maps its features to the decoder's width, and the features
take the place of the image-token embeddings, image by image in order: ``image_slots`` [images, 2] give each
image's (row, first position), and every placeholder must be covered by exactly one image's tokens (a mismatch is
an error naming both counts). The decoder then runs on the embeddings as it runs on token ids. A batch without an
image still runs the tower and projector, on one blank image whose output enters as ``0 · sum``, so that every rank
of a data-parallel run computes the same parameters' gradients (DDP and FSDP would otherwise wait).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from longboat.models.llm.model import Decoder
from longboat.models.vision.ernie4_5_vl import Ernie4_5VisionTower
from longboat.models.vision.qwen2_5_vl import Qwen2_5_VisionTower
from longboat.models.vision.qwen3_vl import Qwen3VisionTower
from longboat.models.vision.siglip import SigLIP
from longboat.models.vision.vit import ViT
from longboat.models.vlm.config import SQUARE_TOWERS, VLMConfig
from longboat.models.vlm.positions import mrope_positions


def build_tower(cfg: VLMConfig) -> nn.Module:
    v = cfg.vision
    if v.arch == "vit":
        return ViT(v, (3, v.image_size, v.image_size))
    if v.arch == "siglip":
        return SigLIP(v)
    if v.arch == "qwen3_vl_vision":
        return Qwen3VisionTower(v)
    if v.arch == "ernie4_5_vl_vision":
        return Ernie4_5VisionTower(v)
    return Qwen2_5_VisionTower(v)


class Projector(nn.Module):
    """Tower features [images, patches, dim] (ViT) or [tokens, dim] (Qwen) -> image tokens [tokens, d_model]."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        p, d_in, d_out = cfg.projector, cfg.vision.feature_dim, cfg.language.d_model
        self.kind, self.merge = p.kind, p.merge_size
        if p.kind == "identity":
            return
        if p.kind == "patch_merger":
            self.norm = nn.LayerNorm(d_in, eps=1e-6)
            d_in *= p.merge_size**2
        if p.kind == "pixel_shuffle":
            self.proj = nn.Linear(d_in * p.merge_size**2, d_out, bias=False)
            self.init_weights()
            return
        hidden = p.hidden_dim or (d_in if p.kind == "patch_merger" else d_out)
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.kind == "identity":
            return features.flatten(0, -2)
        if self.kind in ("patch_merger", "pixel_shuffle"):
            n, patches, d = features.shape
            side, m = int(patches**0.5), self.merge
            x = self.norm(features) if self.kind == "patch_merger" else features
            x = x.view(n, side // m, m, side // m, m, d).transpose(2, 3)
            features = x.reshape(n, (side // m) ** 2, m * m * d)  # row-major merged tokens, each block's patches
            if self.kind == "pixel_shuffle":
                return self.proj(features.flatten(0, -2))
        return self.fc2(F.gelu(self.fc1(features.flatten(0, -2))))


class VLM(nn.Module):
    """``model(tokens, positions, cache, segments, images, image_slots, image_grid)`` -> next-token logits
    [B, T, vocab].

    ``images``: the batch's pixels as the preprocessing gives them, images in slot order (ViT: [images, C, H, W];
    Qwen: patch rows [patches, C·T·P·P] with ``image_grid`` [images, 3]).
    """

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.cfg = cfg
        self.vision = build_tower(cfg)
        self.projector = Projector(cfg)
        self.language = Decoder(cfg.language)

    @torch.no_grad()
    def init_weights(self) -> None:
        self.vision.init_weights()
        self.projector.init_weights()
        self.language.init_weights()

    @torch.no_grad()
    def init_buffers(self) -> None:
        if hasattr(self.vision, "init_buffers"):
            self.vision.init_buffers()
        self.language.init_buffers()

    def image_features(self, images: torch.Tensor, image_grid: torch.Tensor | None = None) -> torch.Tensor:
        """Image tokens [tokens, d_model] of the images, one after the other."""
        return self.encode(images, image_grid)[0]

    def encode(self, images: torch.Tensor, image_grid: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(image tokens [tokens, d_model], DeepStack features: one [tokens, d_model] per tower layer that gives
        them, for the decoder's first layers; none but for Qwen3-VL's tower)."""
        if self.cfg.vision.arch in SQUARE_TOWERS:
            return self.projector(self.vision(images.to(self.vision.patch_embed.weight.dtype))), []
        if image_grid is None:
            raise ValueError(f"the {self.cfg.vision.arch} tower needs image_grid [images, 3] beside its patch rows")
        out = self.vision(images, image_grid)
        features, deepstack = out if isinstance(out, tuple) else (out, [])
        return self.projector(features), deepstack

    def _blank(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        v = self.cfg.vision
        if v.arch in SQUARE_TOWERS:
            return torch.zeros(1, 3, v.image_size, v.image_size, device=device), None
        m = v.merge_size
        return torch.zeros(m * m, v.patch_dim, device=device), torch.tensor([[1, m, m]], device=device)

    def make_cache(self, batch: int, max_len: int, dtype: torch.dtype | None = None,
                   device: torch.device | None = None):
        """The decoder's KV cache (``longboat generate`` decodes text with it)."""
        return self.language.make_cache(batch, max_len, dtype, device)

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache=None,
        segments: torch.Tensor | None = None, images: torch.Tensor | None = None,
        image_slots: torch.Tensor | None = None, image_grid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Arguments in the decoder's order (``cache``: a KV cache for decoding, from ``make_cache``), then the
        batch's images."""
        embeds = self.language.tok_embeddings(tokens)
        placeholders = tokens == self.cfg.image_token_id
        index, deepstack = None, []
        n_images = 0 if images is None else (len(image_grid) if image_grid is not None else len(images))
        if n_images == 0:
            if placeholders.any():
                raise ValueError(f"the tokens hold {int(placeholders.sum())} image tokens but the batch has no image")
            if cache is None:  # decoding with a cache runs on one process: no rank to keep in step
                blank, deep = self.encode(*self._blank(embeds.device))
                embeds = embeds + 0 * sum((f.sum() for f in deep), blank.sum())
        else:
            features, deepstack = self.encode(images, image_grid)
            counts = self._counts(n_images, image_grid)
            index = self._image_index(placeholders, len(features), image_slots, counts.to(embeds.device))
            B, T, D = embeds.shape
            embeds = embeds.reshape(B * T, D).index_put((index,), features.to(embeds.dtype)).view(B, T, D)
        if self.cfg.language.mrope_section is not None:
            positions = self._mrope(tokens, positions, cache, index, n_images, image_grid)
        elif positions is None and cache is None:  # explicit, so that a sequence shard (tensor parallel) rotates right
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        if self.cfg.language.vision_moe is not None and (cache is None or n_images):  # decoding steps: text
            vision = placeholders
            for token in self.cfg.vision_token_ids:
                vision = vision | (tokens == token)
            return self.language(embeds, positions, cache, segments, vision=vision)
        if deepstack:
            return self.language(embeds, positions, cache, segments, layer_inputs=(index, deepstack))
        return self.language(embeds, positions, cache, segments)

    def _mrope(self, tokens: torch.Tensor, positions: torch.Tensor | None, cache, index: torch.Tensor | None,
               n_images: int, image_grid: torch.Tensor | None) -> torch.Tensor:
        """Multimodal positions [3, B, T] (``positions.py``); [B, T] for text alone, where the three rows agree.
        With a cache the tokens are one sample continuing the cached ones, from the cache's next position."""
        B, T = tokens.shape
        base = cache.next_position().to(tokens.device) if cache is not None else None
        if cache is not None:
            positions = None
        if index is None:
            p = torch.arange(T, device=tokens.device).expand(B, T) if positions is None else positions
            return p if base is None else p + base[:, None]
        return mrope_positions((B, T), index, self._grids(n_images, image_grid), positions, base)

    def _grids(self, n_images: int, image_grid: torch.Tensor | None) -> torch.Tensor:
        """Each image's merged grid [images, 3] (frames, rows, columns of its tokens)."""
        m = self.cfg.merge_size
        if image_grid is not None:
            return torch.stack([image_grid[:, 0], image_grid[:, 1] // m, image_grid[:, 2] // m], dim=1)
        side = self.cfg.vision.grid // m
        return torch.tensor([[1, side, side]] * n_images, dtype=torch.long)

    def _counts(self, n_images: int, image_grid: torch.Tensor | None) -> torch.Tensor:
        """Image tokens of each image."""
        if image_grid is not None:
            return image_grid.prod(dim=1) // self.cfg.merge_size**2
        v = self.cfg.vision
        return torch.full((n_images,), (v.grid // self.cfg.merge_size) ** 2, dtype=torch.long)

    def _image_index(self, placeholders: torch.Tensor, n_features: int, image_slots: torch.Tensor | None,
                     counts: torch.Tensor) -> torch.Tensor:
        """The flat (row · T + column) index of every image token, images in order; each image's tokens start at its
        slot (in reading order of the placeholders without slots). Every placeholder must be covered once."""
        n_placeholders = int(placeholders.sum())
        if n_placeholders != n_features:
            raise ValueError(f"the tokens hold {n_placeholders} image tokens but the images give {n_features}")
        B, T = placeholders.shape
        if image_slots is None:  # images in reading order of the placeholders
            return placeholders.flatten().nonzero().squeeze(1)
        if len(image_slots) != len(counts):
            raise ValueError(f"{len(image_slots)} image slots for {len(counts)} images")
        starts = image_slots[:, 0] * T + image_slots[:, 1]
        index = torch.repeat_interleave(starts - torch.cumsum(counts, 0) + counts, counts) + torch.arange(
            n_features, device=placeholders.device)
        if int(index.max()) >= B * T or not bool(placeholders.flatten()[index].all()) \
                or index.unique().numel() != len(index):  # two images on one run would leave another empty
            raise ValueError("image_slots do not point at runs of image tokens as long as their images")
        return index
