"""``color_jitter`` and its hue shift against colorsys and a numpy reference; off in eval."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch

from longboat.data.robot.transforms import TransformError
from longboat.data.robot.transforms.color import shift_hue
from tests.data.robot.transforms.conftest import TOP, build


def test_hue_shift_matches_colorsys_and_keeps_greys():
    rgb = torch.rand(2, 3, 5, 6)
    rgb[0, :, 0, 0] = 0.5  # grey: no hue, no saturation
    rgb[0, :, 0, 1] = 0.0  # black
    rgb[1, :, 0, 0] = torch.tensor([0.9, 0.2, 0.2])  # red with a negative in-sextant offset when turned back
    shift = torch.tensor([0.3, -0.45]).view(2, 1, 1, 1)
    out = shift_hue(rgb, shift)
    for n in range(2):
        px = rgb[n].permute(1, 2, 0).reshape(-1, 3).tolist()
        hsv = (colorsys.rgb_to_hsv(*q) for q in px)
        ref = [colorsys.hsv_to_rgb((h + shift[n].item()) % 1, s, v) for h, s, v in hsv]
        np.testing.assert_allclose(out[n].permute(1, 2, 0).reshape(-1, 3).numpy(), np.array(ref), atol=2e-6)
    assert torch.equal(out[0, :, 0, :2], rgb[0, :, 0, :2])
    torch.testing.assert_close(shift_hue(rgb, torch.zeros(2, 1, 1, 1)), rgb, atol=2e-6, rtol=0)


def numpy_jitter(img: np.ndarray, b: float, c: float, s: float, h: float) -> np.ndarray:
    """One [3, H, W] image through brightness, contrast, saturation, hue with the given factors (float64)."""
    luma = np.array([0.299, 0.587, 0.114])[:, None, None]
    img = np.clip(img * b, 0, 1)
    img = np.clip(c * img + (1 - c) * (img * luma).sum(0).mean(), 0, 1)
    img = np.clip(s * img + (1 - s) * (img * luma).sum(0, keepdims=True), 0, 1)
    px = img.transpose(1, 2, 0).reshape(-1, 3)
    shifted = [colorsys.hsv_to_rgb((hh + h) % 1, ss, vv) for hh, ss, vv in (colorsys.rgb_to_hsv(*q) for q in px)]
    return np.array(shifted).reshape(img.shape[1], img.shape[2], 3).transpose(2, 0, 1)


def test_color_jitter_matches_a_numpy_reference_with_the_drawn_factors():
    cfg = {"brightness": 0.4, "contrast": 0.3, "saturation": 0.5, "hue": 0.1}
    img = torch.rand(2, 2, 3, 6, 7)
    out = build([{"type": "color_jitter", "keys": [TOP], **cfg}]).apply({TOP: img}, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)  # the same draws, one per image, in the documented order
    draws = [torch.rand(4, generator=g).double().numpy() for _ in range(4)]
    b, c, s = ((1 - cfg[k]) + 2 * cfg[k] * d for k, d in zip(("brightness", "contrast", "saturation"), draws))
    h = (draws[3] * 2 - 1) * cfg["hue"]
    flat_in, flat_out = img.reshape(4, 3, 6, 7).double().numpy(), out[TOP].reshape(4, 3, 6, 7).numpy()
    for n in range(4):
        np.testing.assert_allclose(flat_out[n], numpy_jitter(flat_in[n], b[n], c[n], s[n], h[n]), atol=2e-5)
    assert out[TOP].dtype == torch.float32 and out[TOP].min() >= 0 and out[TOP].max() <= 1


def test_color_jitter_is_off_in_eval_and_needs_rgb():
    img = torch.rand(3, 8, 8)
    p = build([{"type": "color_jitter", "keys": [TOP], "brightness": 0.5, "hue": 0.2}])
    assert not torch.equal(p.apply({TOP: img})[TOP], img)
    assert p.eval().apply({TOP: img})[TOP] is img
    with pytest.raises(TransformError, match=r"'observation.images.top' has 1 channels; .* need RGB"):
        p.train().apply({TOP: torch.rand(1, 8, 8)})


def test_color_jitter_on_a_batch_equals_each_sample_jittered_with_its_own_generator():
    jitter = build([{"type": "color_jitter", "keys": [TOP], "brightness": 0.4, "contrast": 0.4, "saturation": 0.4,
                     "hue": 0.1}]).transforms[0]
    batch = {TOP: torch.rand(3, 2, 3, 6, 7)}  # 3 samples of 2 frames

    def generators():
        return [torch.Generator().manual_seed(7 * i) for i in range(3)]

    alone = torch.stack([jitter.apply({TOP: batch[TOP][i]}, g)[TOP] for i, g in enumerate(generators())])
    batched = jitter.apply_batch(batch, generators())[TOP]  # on the CPU: a sample at a time
    at_once = jitter.jitter(batch, generators(), per_sample=False)[TOP]  # an accelerator's way: every image at once
    assert not torch.equal(alone, batch[TOP])
    torch.testing.assert_close(batched, alone, rtol=0, atol=1e-6)
    torch.testing.assert_close(at_once, alone, rtol=0, atol=1e-6)
