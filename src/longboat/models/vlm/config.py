"""The composed vision-language model's config: a vision tower, a projector and a decoder, each from its own parts."""

from __future__ import annotations

from typing import Annotated, Literal, Union

import torch
from pydantic import Field, model_validator

from longboat.config.base import StrictModel, deep_merge
from longboat.data.images.processors import QwenImages, SmolVLMImages, SquareImages
from longboat.data.images.qwen_vl import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, QWEN3_VL, QwenVLImageConfig
from longboat.models.llm.config import DecoderConfig
from longboat.models.registry import get_model
from longboat.models.vision.ernie4_5_vl import Ernie4_5VisionConfig
from longboat.models.vision.qwen2_5_vl import Qwen2_5_VisionConfig
from longboat.models.vision.qwen3_vl import Qwen3VisionConfig
from longboat.models.vision.siglip import SigLIPConfig
from longboat.models.vision.vit import ViTConfig

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ViTTower(ViTConfig):
    """A ViT over square images of ``image_size`` pixels (resized so), one feature per patch."""

    arch: Literal["vit"] = "vit"
    image_size: int = Field(default=224, gt=0, description="images are resized to this square size")
    image_mean: tuple[float, float, float] = IMAGENET_MEAN
    image_std: tuple[float, float, float] = IMAGENET_STD

    @model_validator(mode="after")
    def _fits(self) -> ViTTower:
        if self.image_size % self.patch_size:
            raise ValueError(f"vision.image_size ({self.image_size}) must be a multiple of vision.patch_size "
                             f"({self.patch_size})")
        return self

    @property
    def grid(self) -> int:
        """Patches per image side."""
        return self.image_size // self.patch_size

    @property
    def feature_dim(self) -> int:
        return self.d_model


class QwenTower(Qwen2_5_VisionConfig):
    """Qwen2.5-VL's tower, which merges 2×2 patches itself; images keep their aspect ratio (``smart_resize``)."""

    arch: Literal["qwen2_5_vl_vision"] = "qwen2_5_vl_vision"
    min_pixels: int = Field(default=56 * 56, gt=0)
    max_pixels: int = Field(default=28 * 28 * 1280, gt=0)
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    @property
    def feature_dim(self) -> int:
        return self.out_dim


class SigLIPTower(SigLIPConfig):
    """SigLIP's tower as SmolVLM uses it (``models/vision/siglip.py``): full-size square images of ``image_size``
    pixels (resized so), normed features, one per patch."""

    arch: Literal["siglip"] = "siglip"
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    longest_edge: int | None = Field(default=None, gt=0, description="SmolVLM's preprocessing first resizes an "
                                     "image's longest edge to this (its size.longest_edge); None: 4 × image_size")

    @property
    def feature_dim(self) -> int:
        return self.d_model


class Qwen3Tower(Qwen3VisionConfig):
    """Qwen3-VL's tower (learned positions resampled to each image, its own merger, DeepStack features of
    ``deepstack_layers`` for the decoder's first layers); images keep their aspect ratio (``smart_resize``)."""

    arch: Literal["qwen3_vl_vision"] = "qwen3_vl_vision"
    min_pixels: int = Field(default=QWEN3_VL.min_pixels, gt=0)
    max_pixels: int = Field(default=QWEN3_VL.max_pixels, gt=0)
    image_mean: tuple[float, float, float] = QWEN3_VL.image_mean
    image_std: tuple[float, float, float] = QWEN3_VL.image_std

    @property
    def feature_dim(self) -> int:
        return self.out_dim


class ErnieTower(Ernie4_5VisionConfig):
    """ERNIE-4.5-VL's tower and resampler (``models/vision/ernie4_5_vl.py``): one frame per still image, images keep
    their aspect ratio (``smart_resize``)."""

    arch: Literal["ernie4_5_vl_vision"] = "ernie4_5_vl_vision"
    min_pixels: int = Field(default=56 * 56, gt=0)
    max_pixels: int = Field(default=28 * 28 * 6177, gt=0)
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    @property
    def temporal_patch_size(self) -> int:
        return 1

    @property
    def feature_dim(self) -> int:
        return self.out_dim


# towers that merge patches themselves, images as patch rows
QWEN_TOWERS = ("qwen2_5_vl_vision", "qwen3_vl_vision", "ernie4_5_vl_vision")
SQUARE_TOWERS = ("vit", "siglip")  # towers reading fixed-size square images, one feature per patch
VisionTower = Annotated[Union[ViTTower, QwenTower, Qwen3Tower, SigLIPTower, ErnieTower], Field(discriminator="arch")]


class ProjectorConfig(StrictModel):
    """Tower features to the decoder's width. ``mlp``: two linear layers with a GELU per feature (LLaVA);
    ``patch_merger``: each ``merge_size``² block of neighbouring ViT patches, normed and concatenated, to one token
    (Qwen2-VL's merger), so an image takes ``merge_size``² fewer tokens; ``pixel_shuffle``: each ``merge_size``²
    block concatenated (space to depth, SmolVLM's ``scale_factor``) then one linear layer without bias;
    ``identity``: the tower's features as they are (a tower whose own merger already outputs the decoder's width)."""

    kind: Literal["mlp", "patch_merger", "pixel_shuffle", "identity"] = "mlp"
    hidden_dim: int | None = Field(default=None, gt=0, description="None: the decoder's d_model (mlp), the merged "
                                                                   "width (patch_merger)")
    merge_size: int = Field(default=2, gt=0, description="patch_merger, pixel_shuffle: patches per merged token side")


LANGUAGE_ARCHS = ("decoder",)  # registered architectures whose module takes input embeddings for its tokens


class VLMConfig(StrictModel):
    """``model: {arch: vlm, vision: {arch: ...}, projector: {kind: ...}, language: {arch, preset, ...},
    image_token_id}``: image features take the place of the ``image_token_id`` tokens in the decoder's input."""

    vision: VisionTower
    projector: ProjectorConfig = ProjectorConfig()
    language: DecoderConfig
    image_token_id: int = Field(ge=0, description="the token id an image's placeholder tokens carry")
    vision_token_ids: tuple[int, ...] = Field(default=(), description="with language.vision_moe: tokens besides "
                                              "the image tokens that the vision experts take (ERNIE-4.5-VL's image "
                                              "start and end)")

    @model_validator(mode="before")
    @classmethod
    def _compose(cls, data):
        """``language``'s arch and preset resolved to the decoder's fields; the Qwen tower's ``out_dim`` defaults to
        the decoder's ``d_model``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        language = data.get("language")
        if isinstance(language, dict):
            language = dict(language)
            arch, preset = language.pop("arch", "decoder"), language.pop("preset", None)
            if arch not in LANGUAGE_ARCHS:
                raise ValueError(f"language.arch {arch!r} cannot read image features; known: "
                                 f"{', '.join(LANGUAGE_ARCHS)}")
            if preset is not None:
                language = deep_merge(get_model(arch).load_preset(preset), language)
            data["language"] = language
        vision = data.get("vision")
        if isinstance(vision, dict) and vision.get("arch") in QWEN_TOWERS and "out_dim" not in vision \
                and isinstance(language, dict) and "d_model" in language:
            data["vision"] = {**vision, "out_dim": language["d_model"]}  # its merger outputs the decoder's width
        return data

    @model_validator(mode="after")
    def _check(self) -> VLMConfig:
        v, p = self.vision, self.projector
        if any(not 0 <= t < self.language.vocab_size for t in self.vision_token_ids):
            raise ValueError(f"vision_token_ids {list(self.vision_token_ids)} must be token ids below "
                             f"language.vocab_size ({self.language.vocab_size})")
        if self.image_token_id >= self.language.vocab_size:
            raise ValueError(f"image_token_id ({self.image_token_id}) must be below language.vocab_size "
                             f"({self.language.vocab_size})")
        if p.kind in ("patch_merger", "pixel_shuffle"):
            if v.arch not in SQUARE_TOWERS:
                raise ValueError(f"projector.kind {p.kind!r} merges ViT patches; vision.arch {v.arch!r} merges "
                                 "its own (use projector.kind mlp or identity)")
            if v.grid % p.merge_size:
                raise ValueError(f"projector.merge_size ({p.merge_size}) must divide the {v.grid} patches per image "
                                 f"side (vision.image_size / vision.patch_size)")
        if p.kind == "identity" and v.feature_dim != self.language.d_model:
            raise ValueError(f"projector.kind 'identity' needs the tower's features ({v.feature_dim}) as wide as "
                             f"language.d_model ({self.language.d_model})")
        return self

    # The language-model contract (models/contracts.py).
    @property
    def vocab_size(self) -> int:
        return self.language.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.language.max_seq_len

    @property
    def merge_size(self) -> int:
        """Patches per image token side."""
        if self.vision.arch in QWEN_TOWERS:
            return self.vision.merge_size
        return self.projector.merge_size if self.projector.kind in ("patch_merger", "pixel_shuffle") else 1

    def image_tokens(self, height: int, width: int) -> int:
        """Placeholder tokens an image of ``height`` × ``width`` pixels takes (after the preprocessing's resize)."""
        return self.image_processor().tokens(height, width)

    def image_processor(self):
        """The preprocessing the tower reads its images with (``data/images``)."""
        v = self.vision
        if v.arch == "siglip":
            return SmolVLMImages(v.image_size, v.patch_size, self.merge_size, v.longest_edge or 4 * v.image_size,
                                 v.image_mean, v.image_std)
        if v.arch == "vit":
            return SquareImages(v.image_size, v.patch_size, self.merge_size, v.image_mean, v.image_std)
        return QwenImages(QwenVLImageConfig(patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                                            merge_size=v.merge_size, min_pixels=v.min_pixels,
                                            max_pixels=v.max_pixels, image_mean=v.image_mean,
                                            image_std=v.image_std))

    def flops_per_token(self, seq_len: int) -> int:
        """The decoder's training FLOPs per token, which every token costs (an image token adds
        ``flops_per_image_token``)."""
        return self.language.flops_per_token(seq_len)

    def flops_per_image_token(self) -> int:
        """The tower's and projector's training FLOPs per image token: ``6·params`` per patch for the tower's blocks
        and the attention over an image's (or a window's) patches, ``merge²`` patches a token, and ``6·params`` of
        the merger and projector."""
        from longboat.models.vlm.model import Projector, build_tower

        with torch.device("meta"):
            tower, projector = build_tower(self), Projector(self)
        blocks = sum(p.numel() for p in tower.blocks.parameters())
        rest = sum(p.numel() for p in tower.parameters()) - blocks
        v = self.vision
        if v.arch in SQUARE_TOWERS:
            span = v.grid**2
        elif v.arch == "qwen3_vl_vision":  # whole images: the pretraining grid's patches as a typical image
            span = v.num_position_embeddings
        elif v.arch == "ernie4_5_vl_vision":  # whole images: 32 × 32 patches as a typical image
            span = 1024
        else:
            span = (v.window_tokens * v.merge_size) ** 2
        per_patch = 6 * blocks + 12 * v.n_layers * v.d_model * span
        merged = self.merge_size ** 2
        return merged * per_patch + 6 * rest + 6 * sum(p.numel() for p in projector.parameters())
