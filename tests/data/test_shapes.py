"""The captioned shapes: the same images every call, each caption's colour where its shape is drawn."""

import torch

from longboat.data.image_sources import ImageSourceConfig, open_images
from longboat.data.shapes import COLOURS, load_shapes


def test_shapes_are_deterministic_captioned_and_coloured_as_captioned():
    images, labels, classes, captions = load_shapes(16, 3, per_caption=2)
    again = load_shapes(16, 3, per_caption=2)
    assert torch.equal(images, again[0]) and captions == again[3]
    assert images.shape == (24, 3, 16, 16) and len(classes) == 12 and sorted(set(captions)) == classes
    assert [classes[i] for i in labels.tolist()] == captions
    for image, caption in zip(images, captions):
        lit = image.flatten(1)[:, image.max(0).values.flatten() > 0]  # the shape's pixels
        want = torch.tensor(COLOURS[caption.split()[1]], dtype=torch.float) / 127.5 - 1
        assert 6 < lit.shape[1] < 200 and (lit.mean(1) - want).abs().max() < 0.35, caption


def test_the_source_by_name():
    shapes = open_images(ImageSourceConfig(source="shapes", image_size=8, channels=1))
    assert shapes.images.shape == (480, 1, 8, 8) and shapes.captions[0] == "a blue circle"
    assert shapes.images.min() >= -1 and shapes.images.max() <= 1
