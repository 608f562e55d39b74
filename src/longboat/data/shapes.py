"""``shapes``: a small captioned image set drawn here, deterministically, for text-conditioned generators that must
train without a download: a red, green, blue or yellow circle, square or triangle on black, at a jittered place and
size, captioned "a red circle". Labels are the caption's index among the sorted captions, so a class-conditional
model trains on it too."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw

SHAPES = "shapes"
COLOURS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (50, 80, 235), "yellow": (235, 215, 40)}
KINDS = ("circle", "square", "triangle")
PER_CAPTION = 40
_SUPERSAMPLE = 4  # drawn this many times larger, then downscaled: smooth edges at small sizes


def caption_of(colour: str, kind: str) -> str:
    return f"a {colour} {kind}"


def draw_shape(colour: str, kind: str, image_size: int, rng: np.random.Generator) -> Image.Image:
    """One shape on black: its size a third to a half of the image, its centre jittered so it stays inside."""
    side = image_size * _SUPERSAMPLE
    image = Image.new("RGB", (side, side))
    pen = ImageDraw.Draw(image)
    radius = side * rng.uniform(0.17, 0.25)
    cx, cy = (rng.uniform(radius + 1, side - radius - 1) for _ in range(2))
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    fill = COLOURS[colour]
    if kind == "circle":
        pen.ellipse(box, fill=fill)
    elif kind == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(cx, cy - radius), (cx - radius, cy + radius), (cx + radius, cy + radius)], fill=fill)
    return image.resize((image_size, image_size), Image.Resampling.BOX)


def load_shapes(image_size: int = 16, channels: int = 3, per_caption: int = PER_CAPTION):
    """(images [N, C, H, W] in [-1, 1], labels [N], classes, captions [N]): ``per_caption`` images of each of the
    12 captions, interleaved, the same on every call."""
    classes = sorted(caption_of(c, k) for c in COLOURS for k in KINDS)
    rng = np.random.default_rng(0)
    images, labels, captions = [], [], []
    for _ in range(per_caption):
        for label, caption in enumerate(classes):
            _, colour, kind = caption.split(" ")
            image = draw_shape(colour, kind, image_size, rng)
            if channels == 1:
                image = image.convert("L")
            array = np.asarray(image, dtype=np.uint8).reshape(image_size, image_size, channels)
            images.append(torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 127.5 - 1)
            labels.append(label)
            captions.append(caption)
    return torch.stack(images), torch.tensor(labels, dtype=torch.int64), classes, captions
