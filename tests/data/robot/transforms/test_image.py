"""Image transforms against numpy and PIL: ``resize_pad`` (aspect kept, antialiased), ``center_crop`` and
``random_crop`` (a window drawn per image, reproducibly; centred in eval)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from longboat.data.robot.transforms import TransformError
from tests.data.robot.transforms.conftest import TOP, build


def numpy_bilinear(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """[C, H, W] resized with half-pixel centres and no antialiasing (torch's align_corners=False)."""
    def taps(n_in, n_out):
        src = np.maximum((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0)
        i0 = np.floor(src).astype(int)
        return i0, np.minimum(i0 + 1, n_in - 1), (src - i0).astype(np.float32)

    (r0, r1, wr), (c0, c1, wc) = taps(img.shape[1], out_h), taps(img.shape[2], out_w)
    rows = img[:, r0] * (1 - wr)[:, None] + img[:, r1] * wr[:, None]
    return rows[:, :, c0] * (1 - wc) + rows[:, :, c1] * wc


def pil_bilinear(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """PIL's bilinear resize (which widens its filter when shrinking), per channel in float mode."""
    return np.stack([np.asarray(Image.fromarray(c.astype(np.float32)).resize((out_w, out_h), Image.Resampling.BILINEAR))
                     for c in img])


@pytest.mark.parametrize("hw, content, offset", [((48, 64), (21, 28), (3, 0)), ((64, 30), (28, 13), (0, 7)),
                                                 ((28, 28), (28, 28), (0, 0))])
def test_resize_pad_keeps_the_aspect_and_centres_the_image(hw, content, offset):
    img = torch.rand(2, 3, *hw)
    p = build([{"type": "resize_pad", "keys": [TOP], "size": [28, 28], "antialias": False, "pad_value": -1}])
    out = p.apply({TOP: img})[TOP]
    assert out.shape == (2, 3, 28, 28)
    (ch, cw), (top, left) = content, offset
    inside = out[..., top:top + ch, left:left + cw]
    for b in range(2):
        np.testing.assert_allclose(inside[b].numpy(), numpy_bilinear(img[b].numpy(), ch, cw), atol=1e-5)
    border = torch.ones(28, 28, dtype=torch.bool)
    border[top:top + ch, left:left + cw] = False
    assert (out[..., border] == -1).all()


def test_resize_pad_antialiased_matches_pil_and_handles_time_and_batch():
    img = torch.rand(2, 2, 3, 60, 80)  # [B, T, C, H, W]
    out = build([{"type": "resize_pad", "keys": [TOP], "size": [24, 24]}]).apply({TOP: img})[TOP]
    assert out.shape == (2, 2, 3, 24, 24)
    for b, t in ((0, 0), (1, 1)):
        np.testing.assert_allclose(out[b, t, :, 3:21].numpy(), pil_bilinear(img[b, t].numpy(), 18, 24), atol=2e-5)
    assert (out[..., :3, :] == 0).all() and (out[..., 21:, :] == 0).all()


def test_center_crop_matches_slicing_and_refuses_small_images():
    img = torch.rand(4, 3, 11, 14)
    out = build([{"type": "center_crop", "keys": [TOP], "size": [6, 9]}]).apply({TOP: img})[TOP]
    np.testing.assert_array_equal(out.numpy(), img.numpy()[..., 2:8, 2:11])
    with pytest.raises(TransformError, match=r"center_crop: 'observation.images.top' is 11x14, smaller than .*12x9"):
        build([{"type": "center_crop", "keys": [TOP], "size": [12, 9]}]).apply({TOP: img})


def test_center_crop_rounds_its_offset_as_torchvision_when_asked():
    img = torch.rand(2, 3, 48, 64)  # rooms 7 and 7: half is 3.5, which torchvision rounds to 4 (half to even)
    out = build([{"type": "center_crop", "keys": [TOP], "size": [41, 57], "centre": "round"}]).apply({TOP: img})[TOP]
    np.testing.assert_array_equal(out.numpy(), img.numpy()[..., 4:45, 4:61])
    img = torch.rand(2, 3, 46, 64)  # room 5: 2.5 rounds to 2
    out = build([{"type": "center_crop", "keys": [TOP], "size": [41, 57], "centre": "round"}]).apply({TOP: img})[TOP]
    np.testing.assert_array_equal(out.numpy(), img.numpy()[..., 2:43, 4:61])


def test_random_crop_draws_a_window_per_image_reproducibly_and_centres_in_eval():
    img = torch.rand(3, 2, 3, 10, 12)
    spec = [{"type": "random_crop", "keys": [TOP], "size": [6, 7]}]
    out = build(spec, seed=5).apply({TOP: img})[TOP]
    assert out.shape == (3, 2, 3, 6, 7)
    offsets = set()
    for b in range(3):
        for t in range(2):
            src, crop = img[b, t].numpy(), out[b, t].numpy()
            found = [(i, j) for i in range(5) for j in range(6) if np.array_equal(src[:, i:i + 6, j:j + 7], crop)]
            assert len(found) == 1
            offsets.add(found[0])
    assert len(offsets) > 1  # each image draws its own position
    torch.testing.assert_close(build(spec, seed=5).apply({TOP: img})[TOP], out, rtol=0, atol=0)
    g = torch.Generator().manual_seed(1)
    per_sample = build(spec, seed=5).apply({TOP: img}, g)[TOP]
    assert not torch.equal(per_sample, out)
    torch.testing.assert_close(build(spec).apply({TOP: img}, torch.Generator().manual_seed(1))[TOP], per_sample)
    centre = build(spec, train=False).apply({TOP: img})[TOP]
    np.testing.assert_array_equal(centre.numpy(), img.numpy()[..., 2:8, 2:9])


def test_random_crop_on_a_batch_draws_each_samples_offsets_from_its_own_generator():
    crop = build([{"type": "random_crop", "keys": [TOP], "size": [5, 6]}]).transforms[0]
    batch = {TOP: torch.rand(4, 3, 3, 9, 11)}  # 4 samples of 3 frames

    def generators():
        return [torch.Generator().manual_seed(100 + i) for i in range(4)]

    batched = crop.apply_batch(batch, generators())[TOP]
    alone = torch.stack([crop.apply({TOP: batch[TOP][i]}, g)[TOP] for i, g in enumerate(generators())])
    assert batched.shape == (4, 3, 3, 5, 6) and torch.equal(batched, alone)
    crop.training = False  # evaluation: the centre, on a batch as on a sample
    assert torch.equal(crop.apply_batch(batch, generators())[TOP], batch[TOP][..., 2:7, 2:8])


def test_the_gathered_crops_of_an_accelerator_equal_the_copied_ones():
    from longboat.data.robot.transforms.image import crop_each, gather_crops

    images = torch.rand(6, 3, 9, 11)
    tops, lefts = [0, 4, 2, 1, 3, 0], [4, 0, 3, 1, 2, 4]
    assert torch.equal(gather_crops(images, tops, lefts, (5, 7)), crop_each(images, tops, lefts, (5, 7)))
