"""Prompts with images for ``generate``, ``chat`` and ``eval-lm``: read and expanded as the model's SFT data does.

A model reads images when its config answers ``models.contracts.image_reader``; the placeholder is the text of its
``image_token_id`` in the tokenizer. Each placeholder token of a prompt becomes its image's tokens
(``data.chat.images.expand_images``, as in training) and the pixels come from the same processor, so the model sees
at inference exactly what it saw in training. A text with images but no placeholder gets one per image at its start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from longboat.config.base import ConfigError
from longboat.data.chat.images import IMAGE_KEYS, ImageRef, expand_images, image_ref
from longboat.data.chat.sources import Malformed
from longboat.data.chat.supervision import Sample
from longboat.data.labels import IGNORE_INDEX
from longboat.models.contracts import ImageReader, image_reader
from longboat.models.registry import hooks_of

if TYPE_CHECKING:
    from longboat.recipes.generate import LoadedModel


@dataclass
class ImagePrompt:
    """Token ids with each placeholder expanded, and the model's keyword inputs for them (pixels, slots)."""

    ids: list[int]
    inputs: dict[str, torch.Tensor]


@dataclass(frozen=True)
class ImageInputs:
    """What a model that reads images needs at inference: its reader and the placeholder's text."""

    reader: ImageReader
    placeholder: str


def image_inputs_of(model: torch.nn.Module, tokenizer) -> ImageInputs | None:
    """The model's image reader and placeholder; None for a text-only model (or one whose token is not one token)."""
    reader = image_reader(getattr(model, "cfg", None))
    if reader is None:
        return None
    text = tokenizer.backend.id_to_token(reader.image_token_id)
    if text is None or tokenizer.encode(text) != [reader.image_token_id]:
        return None
    return ImageInputs(reader, text)


def require_images(loaded: LoadedModel) -> ImageInputs:
    """The model's ``ImageInputs``; a one-line error when it reads no images."""
    if loaded.images is None:
        cfg = getattr(loaded.model, "cfg", None)
        token = getattr(cfg, "image_token_id", None)
        why = (f"its image token {token} is not a single token of its tokenizer" if isinstance(token, int)
               else f"{type(cfg).__name__} is a text-only model")
        raise ConfigError(f"{loaded.source}: the model reads no images ({why}); drop the images")
    return loaded.images


def with_placeholders(text: str, n_images: int, placeholder: str, where: str) -> str:
    """``text`` holding one placeholder per image: as written, or put at its start when it holds none."""
    n = text.count(placeholder)
    if n == 0:
        return placeholder * n_images + text
    if n != n_images:
        raise ConfigError(f"{where}: {n} placeholders {placeholder!r} for {n_images} images")
    return text


def read_images(loaded: LoadedModel, paths: Sequence[str | Path], where: str = "--image") -> list[ImageRef]:
    """Each image's file and token count from its header; a missing or unreadable one fails naming it."""
    processor = require_images(loaded).reader.processor
    refs = []
    for path in paths:
        try:
            refs.append(image_ref(Path(path), processor))
        except Malformed as e:
            raise ConfigError(f"{where} {path}: {e.reason} ({e.detail})") from None
    return refs


def expand_ids(loaded: LoadedModel, ids: Sequence[int], images: Sequence[ImageRef], where: str = "prompt"
               ) -> Sample:
    """``ids`` with each placeholder token repeated to its image's tokens; its ``images`` carry their offsets."""
    found = require_images(loaded)
    token = found.reader.image_token_id
    n = sum(1 for t in ids if t == token)
    if n != len(images):
        raise ConfigError(f"{where}: {n} image tokens {found.placeholder!r} for {len(images)} images")
    tokens = np.asarray(ids, dtype=np.int64)
    return expand_images(Sample(tokens, np.full_like(tokens, IGNORE_INDEX)), images, token)


def pixel_inputs(loaded: LoadedModel, images: Sequence[ImageRef], start: int = 0) -> dict[str, torch.Tensor]:
    """The model's inputs for ``images`` (with offsets, none before ``start``): pixels from the data's processor and
    ``image_slots`` relative to ``start``."""
    processor = require_images(loaded).reader.processor
    inputs = dict(processor([r.path for r in images]) if images else processor.empty())
    inputs["image_slots"] = torch.tensor([(0, r.offset - start) for r in images], dtype=torch.int64).view(-1, 2)
    return inputs


def expand_prompt(loaded: LoadedModel, ids: Sequence[int], images: Sequence[ImageRef], where: str = "prompt"
                  ) -> ImagePrompt:
    """``ids`` with each placeholder token repeated to its image's tokens, and the images' pixels and slots."""
    sample = expand_ids(loaded, ids, images, where)
    return ImagePrompt([int(t) for t in sample.tokens], pixel_inputs(loaded, sample.images))


def collate(inputs: Sequence[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Rows' image inputs as one batch's: images concatenated in row order, each slot given its row."""
    batch: dict[str, Any] = {key: torch.cat([i[key] for i in inputs]) for key in IMAGE_KEYS if key in inputs[0]}
    slots = []
    for row, i in enumerate(inputs):
        s = i["image_slots"].clone()
        s[:, 0] = row
        slots.append(s)
    batch["image_slots"] = torch.cat(slots)
    return batch


def model_inputs(model: torch.nn.Module, inputs: dict[str, torch.Tensor], device: torch.device
                 ) -> dict[str, torch.Tensor]:
    """The keyword inputs ``model`` takes from ``inputs``, as training takes them from a batch (its spec's
    ``ModelHooks.model_inputs``), on ``device``."""
    take = hooks_of(model).model_inputs
    return {k: v.to(device) for k, v in (take(inputs) if take is not None else inputs).items()}
