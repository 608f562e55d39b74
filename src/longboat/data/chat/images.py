"""Conversations with images: rows read with their images, each placeholder expanded to the image's tokens, and
rows of samples that carry their images' pixels and slots.

Two row forms hold images. OpenAI-style ``messages`` whose content is a list of parts, ``{"type": "text", "text":
...}`` and ``{"type": "image", "image": path}`` (or ``{"type": "image_url", "image_url": {"url": path}}``, a local
path or ``file://`` URL); and rows (ShareGPT/LLaVA ``conversations``, or ``messages``) whose
text holds placeholders (``<image>`` by default) with the images listed in ``images`` (or a LLaVA ``image``). Paths
are relative to the data file. Image parts become placeholders in the text, so the chat template renders plain
strings; the placeholder must be one token of the tokenizer, the model's ``image_token_id``. After tokenization each
placeholder token is repeated to exactly the tokens its image takes (from the image's size and the tower's patch
and merge geometry), none of them supervised. A row whose placeholders and images disagree, or whose image is
missing or unreadable, is malformed (counted with its row number). Only the images' headers are read here; the
pixels are decoded when a row is read, in the loader's workers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

from longboat.data.chat.packing import ChatRows, best_fit_decreasing
from longboat.data.chat.sources import Conversation, Format, Malformed, SourceReport, check_source, normalise, \
    row_tools, source_rows
from longboat.data.chat.supervision import Sample
from longboat.data.images.processors import ImageProcessor
from longboat.data.labels import IGNORE_INDEX

IMAGE_KEYS = ("images", "image_grid")  # the processor's batch entries, concatenated over a batch's rows
EXIF_ORIENTATION, TRANSPOSED = 0x0112, (5, 6, 7, 8)  # orientations that swap width and height


@dataclass(frozen=True)
class ImageRef:
    """One image of a sample: its file, the tokens it takes, and the position of its first token in the sample."""

    path: str
    tokens: int
    offset: int = -1


def read_image_conversations(path: str | Path, processor: ImageProcessor, placeholder: str = "<image>",
                             format: Format = "auto", split: str | None = None) -> tuple[list[Conversation],
                                                                                         SourceReport]:
    """Every well-formed conversation of one source with its images, and the report of what was skipped."""
    check_source(path, split)
    base = Path(path).parent if Path(path).is_file() else Path(path)
    report = SourceReport(str(path))
    conversations = []
    for row, raw in source_rows(Path(path), split, report):
        report.rows += 1
        try:
            text_row, images = _images_of(raw, placeholder, base, processor)
            conversations.append(Conversation(normalise(text_row, format), row, row_tools(raw), images))
        except Malformed as e:
            report.count(row, e.reason, raw, e.detail)
    return conversations, report


def _images_of(raw: Any, placeholder: str, base: Path, processor: ImageProcessor) -> tuple[Any, list[ImageRef]]:
    """The row with image parts turned into placeholders, and its images in placeholder order."""
    if not isinstance(raw, dict):
        return raw, []
    row, paths = dict(raw), []
    if isinstance(row.get("messages"), list):
        row["messages"] = [_flatten_parts(m, placeholder, paths) if isinstance(m, dict) else m
                           for m in row["messages"]]
    listed = row.get("images") or row.get("image")  # a columnar file gives a row without images null or []
    if listed:
        if paths:
            raise Malformed("image count mismatch", "images given both as content parts and as a list")
        listed = [listed] if isinstance(listed, str) else listed
        if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
            raise Malformed("image count mismatch", "images must be a list of paths")
        paths = listed
    turns = row.get("messages") if "messages" in row else row.get("conversations")
    texts = [m.get("content", m.get("value")) for m in turns if isinstance(m, dict)] if isinstance(turns, list) \
        else [row.get(k) for k in ("instruction", "input", "output", "system")]  # alpaca
    n = sum(t.count(placeholder) for t in texts if isinstance(t, str))
    if n != len(paths):
        raise Malformed("image count mismatch", f"{n} placeholders {placeholder!r}, {len(paths)} images")
    return row, [_image_ref(base / p, processor) for p in paths]


def _flatten_parts(message: dict, placeholder: str, paths: list[str]) -> dict:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    text = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif kind == "image" and isinstance(part.get("image"), str):
            text.append(placeholder)
            paths.append(part["image"])
        elif kind == "image_url" and isinstance(url := _url(part.get("image_url")), str) and not \
                url.startswith(("data:", "http:", "https:")):  # a local file; inline and remote images are not read
            text.append(placeholder)
            paths.append(url.removeprefix("file://"))
        else:
            raise Malformed("unknown content part", repr(part)[:100])
    return {**message, "content": "".join(text)}


def _url(value: Any) -> Any:
    return value.get("url") if isinstance(value, dict) else value


def _image_ref(path: Path, processor: ImageProcessor) -> ImageRef:
    """The image's tokens from its size, read from its header (upright, as decoding will turn it)."""
    try:
        with Image.open(path) as image:
            width, height = image.size
            if image.getexif().get(EXIF_ORIENTATION) in TRANSPOSED:
                width, height = height, width
    except FileNotFoundError:
        raise Malformed("missing image", str(path)) from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise Malformed("unreadable image", f"{path}: {e}") from None
    try:
        return ImageRef(str(path), processor.tokens(height, width))
    except ValueError as e:  # e.g. an aspect ratio the preprocessing refuses
        raise Malformed("unreadable image", f"{path}: {e}") from None


def expand_images(sample: Sample, images: Sequence[ImageRef], image_token_id: int) -> Sample:
    """The sample with each image token repeated to its image's tokens (the first images of the conversation, one per
    image token of the sample), and no label on an image token or on the token before one."""
    at = np.flatnonzero(sample.tokens == image_token_id)
    if len(at) > len(images):
        raise ValueError(f"the sample holds {len(at)} image tokens but its conversation has {len(images)} images")
    if len(at) == 0:
        return sample
    refs = images[:len(at)]
    counts = np.ones(len(sample.tokens), dtype=np.int64)
    counts[at] = [r.tokens for r in refs]
    starts = np.cumsum(counts) - counts
    tokens = np.repeat(sample.tokens, counts)
    labels = np.repeat(sample.labels, counts)
    for position, ref in zip(at, refs):  # the last of an image's tokens keeps the label of the token after it
        labels[starts[position]:starts[position] + ref.tokens - 1] = IGNORE_INDEX
    labels[labels == image_token_id] = IGNORE_INDEX
    return Sample(tokens, labels, [replace(r, offset=int(starts[p])) for p, r in zip(at, refs)])


class ImageChatRows(ChatRows):
    """Rows of samples with their images: a row also gives its images' pixels (decoded here, in the loader's
    workers) and ``image_slots`` [images, 2] (row, first token position), images in slot order."""

    def __init__(self, samples: Sequence[Sample], rows: list[list[int]], seq_len: int, pad_id: int,
                 processor: ImageProcessor):
        super().__init__(samples, rows, seq_len, pad_id)
        self.processor = processor
        self.images = [[(r.path, r.offset) for r in s.images] for s in samples]

    def __getitem__(self, r: int) -> dict[str, torch.Tensor]:
        item = super().__getitem__(r)
        paths, slots, at = [], [], 0
        for i in self.row_samples[self.row_starts[r]:self.row_starts[r + 1]]:
            for path, offset in self.images[i]:
                paths.append(path)
                slots.append((0, at + offset))
            at += self.starts[i + 1] - self.starts[i]
        item.update(self.processor(paths) if paths else self.processor.empty())
        item["image_slots"] = torch.tensor(slots, dtype=torch.int64).view(-1, 2)
        return item

    @staticmethod
    def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Rows stacked; their images concatenated in row order, each slot given its row."""
        batch = {k: torch.stack([item[k] for item in items]) for k in items[0] if k not in (*IMAGE_KEYS, "image_slots")}
        for key in IMAGE_KEYS:
            if key in items[0]:
                batch[key] = torch.cat([item[key] for item in items])
        slots = [item["image_slots"].clone() for item in items]
        for row, s in enumerate(slots):
            s[:, 0] = row
        batch["image_slots"] = torch.cat(slots)
        return batch


def image_rows(samples: Sequence[Sample], seq_len: int, pad_id: int, processor: ImageProcessor,
               packing: bool = True) -> ImageChatRows:
    """Samples with images packed (best-fit decreasing) or one per row; an image stays with its sample."""
    if packing:
        rows = best_fit_decreasing([len(s) for s in samples], seq_len)
    else:
        if any(len(s) > seq_len for s in samples):
            raise ValueError(f"every sample must hold at most {seq_len} tokens")
        rows = [[i] for i in range(len(samples))]
    return ImageChatRows(samples, rows, seq_len, pad_id, processor)
