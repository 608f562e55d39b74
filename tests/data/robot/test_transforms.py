"""Robot data transforms against numpy, colorsys and PIL references; round trips; the pipeline from YAML,
serialised through safetensors and an export; errors that name what is wrong."""

from __future__ import annotations

import colorsys
import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from longboat.config.base import ConfigError, StrictModel
from longboat.data.robot.transforms import (
    Pipeline,
    Transform,
    TransformError,
    load_pipeline,
    pipeline_assets,
    register_transform,
    transform_names,
)
from longboat.data.robot.transforms import base as transforms_base
from longboat.data.robot.transforms.color import shift_hue
from longboat.utils.registry import RegistryError

STATE, ACTION, TOP, WRIST = "observation.state", "action", "observation.images.top", "observation.images.wrist"
STAT_NAMES = ("min", "max", "mean", "std", "q01", "q10", "q50", "q90", "q99")


def vector_stats(rng: np.random.Generator, dim: int) -> dict:
    """LeRobot-shaped statistics of a feature [dim] (float64, as a reader hands them over)."""
    x = rng.normal(size=(500, dim)) * rng.uniform(0.5, 3, dim) + rng.normal(size=dim)
    q = {f"q{p:02d}": np.quantile(x, p / 100, axis=0) for p in (1, 10, 50, 90, 99)}
    return {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0), "count": np.array([500]), **q}


@pytest.fixture
def stats():
    rng = np.random.default_rng(0)
    image = {"mean": np.full((3, 1, 1), 0.5), "std": np.full((3, 1, 1), 0.25), "min": np.zeros((3, 1, 1)),
             "max": np.ones((3, 1, 1)), "count": np.array([500])}
    return {STATE: vector_stats(rng, 9), ACTION: vector_stats(rng, 7), TOP: image}


def f32(stats: dict, feature: str, stat: str) -> np.ndarray:
    return np.asarray(stats[feature][stat], dtype=np.float32)


def build(specs, stats=None, **kwargs) -> Pipeline:
    return Pipeline.from_config(specs, stats, **kwargs)


# --- normalize -----------------------------------------------------------------------------------------------

def numpy_normalize(x: np.ndarray, stats: dict, feature: str, mode: str, eps: float = 1e-6) -> np.ndarray:
    x, eps = x.astype(np.float32), np.float32(eps)
    if mode == "mean_std":
        return (x - f32(stats, feature, "mean")) / (f32(stats, feature, "std") + eps)
    lo, hi = {"min_max": ("min", "max"), "quantiles": ("q01", "q99")}[mode]
    lo, hi = f32(stats, feature, lo), f32(stats, feature, hi)
    return (x - lo) / (hi - lo + eps) * np.float32(2) - np.float32(1)


@pytest.mark.parametrize("mode", ["mean_std", "min_max", "quantiles"])
@pytest.mark.parametrize("shape", [(7,), (4, 7), (2, 50, 7)])
def test_normalize_matches_numpy_and_inverts(stats, mode, shape):
    p = build([{"type": "normalize", "features": {ACTION: mode}}], stats)
    x = torch.randn(shape, dtype=torch.float64) * 3  # float64 in: float32 out
    y = p.apply({ACTION: x})[ACTION]
    assert y.dtype == torch.float32 and y.shape == x.shape
    np.testing.assert_array_equal(y.numpy(), numpy_normalize(x.numpy(), stats, ACTION, mode))
    back = p.unapply({ACTION: y})[ACTION]
    np.testing.assert_allclose(back.numpy(), x.numpy(), rtol=0, atol=2e-6 * (1 + x.abs().max().item()))


def test_quantiles_map_q01_q99_to_minus_one_one(stats):
    p = build([{"type": "normalize", "features": {ACTION: "quantiles"}, "eps": 0}], stats)
    q = torch.tensor(np.stack([stats[ACTION]["q01"], stats[ACTION]["q99"]]), dtype=torch.float32)
    y = p.apply({ACTION: q})[ACTION]
    torch.testing.assert_close(y, torch.tensor([[-1.0] * 7, [1.0] * 7]), atol=1e-5, rtol=0)


def test_normalize_images_per_channel_identity_and_absent_features(stats):
    p = build([{"type": "normalize", "features": {TOP: "mean_std", STATE: "identity", ACTION: "min_max"}}], stats)
    img, state = torch.rand(2, 5, 3, 8, 8), torch.randn(9)
    out = p.apply({TOP: img, STATE: state, "task": "pick"})  # no action: an inference observation
    torch.testing.assert_close(out[TOP], (img - 0.5) / (0.25 + 1e-6))
    assert out[STATE] is state and out["task"] == "pick" and ACTION not in out
    assert p.state_dict().keys() == {f"{TOP}/mean", f"{TOP}/std", f"{ACTION}/min", f"{ACTION}/max"}


def test_normalize_refuses_an_empty_range_and_a_wrong_shape(stats):
    stats[ACTION]["max"] = stats[ACTION]["min"].copy()
    with pytest.raises(ConfigError, match=r"'action' give a min_max range that is not positive"):
        build([{"type": "normalize", "features": {ACTION: "min_max"}, "eps": 0}], stats)
    p = build([{"type": "normalize", "features": {STATE: "mean_std"}}], stats)
    with pytest.raises(TransformError, match=r"'observation.state' has shape \[2, 7\], which does not end in .*\[9\]"):
        p.apply({STATE: torch.zeros(2, 7)})


# --- images --------------------------------------------------------------------------------------------------

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


# --- colour --------------------------------------------------------------------------------------------------

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


# --- padding -------------------------------------------------------------------------------------------------

def test_pad_dim_zero_pads_and_slices_back_to_the_stats_size(stats):
    p = build([{"type": "pad_dim", "keys": [STATE, ACTION], "dim": 12}], stats)
    item = {STATE: torch.randn(4, 9), ACTION: torch.randn(4, 50, 7)}
    out = p.apply(item)
    np.testing.assert_array_equal(out[ACTION].numpy(), np.pad(item[ACTION].numpy(), [(0, 0), (0, 0), (0, 5)]))
    np.testing.assert_array_equal(out[STATE].numpy(), np.pad(item[STATE].numpy(), [(0, 0), (0, 3)]))
    back = p.unapply({ACTION: out[ACTION] + 1})  # a model's output: the padding is not zero any more
    np.testing.assert_array_equal(back[ACTION].numpy(), item[ACTION].numpy() + 1)
    with pytest.raises(TransformError, match=r"pad_dim: 'action' has 8 dimensions, expected 7"):
        p.apply({ACTION: torch.randn(50, 8)})
    with pytest.raises(ConfigError, match=r"pad_dim: 'observation.state' has 9 dimensions .*more than dim=8"):
        build([{"type": "pad_dim", "keys": [STATE], "dim": 8}], stats)


@pytest.mark.parametrize("fill", ["last", "zeros"])
def test_pad_horizon_pads_the_chunk_and_extends_the_mask(fill):
    chunk = torch.randn(2, 30, 7)
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[1, 25:] = True  # the dataset's own padding past an episode's end
    out = build([{"type": "pad_horizon", "horizon": 50, "fill": fill}]).apply({ACTION: chunk, "action_is_pad": mask})
    tail = np.repeat(chunk.numpy()[:, -1:], 20, 1) if fill == "last" else np.zeros((2, 20, 7), np.float32)
    np.testing.assert_array_equal(out[ACTION].numpy(), np.concatenate([chunk.numpy(), tail], 1))
    expected = np.concatenate([mask.numpy(), np.ones((2, 20), bool)], 1)
    np.testing.assert_array_equal(out["action_is_pad"].numpy(), expected)


def test_pad_horizon_writes_a_mask_and_refuses_long_chunks():
    p = build([{"type": "pad_horizon", "horizon": 4}])
    out = p.apply({ACTION: torch.randn(4, 3)})
    assert out["action_is_pad"].dtype == torch.bool and not out["action_is_pad"].any()
    with pytest.raises(TransformError, match=r"pad_horizon: 'action' has 5 steps, more than horizon=4"):
        p.apply({ACTION: torch.randn(5, 3)})


# --- relative actions ----------------------------------------------------------------------------------------

def test_delta_actions_subtract_the_current_state_on_chosen_dims_and_add_it_back():
    p = build([{"type": "delta_actions", "dims": [0, 2, 3]}])
    action, history = torch.randn(2, 10, 5), torch.randn(2, 3, 6)  # a state history [B, T, D]: its last is now
    out = p.apply({ACTION: action, STATE: history})
    ref = action.numpy().copy()
    ref[..., [0, 2, 3]] -= history.numpy()[:, -1:, [0, 2, 3]]
    np.testing.assert_array_equal(out[ACTION].numpy(), ref)
    torch.testing.assert_close(p.unapply(out)[ACTION], action, atol=1e-6, rtol=0)
    single = build([{"type": "delta_actions"}]).apply({ACTION: action[0], STATE: history[0, -1, :5]})
    np.testing.assert_allclose(single[ACTION].numpy(), action[0].numpy() - history[0, -1, :5].numpy())


def test_delta_actions_errors_name_the_keys():
    p = build([{"type": "delta_actions", "dims": [6]}])
    with pytest.raises(TransformError, match=r"has 'action' but no 'observation.state' to make it absolute"):
        p.unapply({ACTION: torch.randn(4, 7)})
    with pytest.raises(TransformError, match=r"dims \[6\] reach past 'action' \(7\) or 'observation.state' \(6\)"):
        p.apply({ACTION: torch.randn(4, 7), STATE: torch.randn(6)})


# --- selected dimensions -------------------------------------------------------------------------------------

def test_select_dims_keeps_chosen_state_dims_after_normalizing_the_whole_state(stats):
    p = build([{"type": "normalize", "features": {STATE: "mean_std", ACTION: "min_max"}},
               {"type": "select_dims", "dims": [3, 0, 1]}], stats)
    history, action = torch.randn(2, 3, 9), torch.randn(2, 10, 7)  # [B, T, D] state, [B, H, A] action
    out = p.apply({STATE: history, ACTION: action})
    full = numpy_normalize(history.numpy(), stats, STATE, "mean_std")
    np.testing.assert_allclose(out[STATE].numpy(), full[..., [3, 0, 1]], rtol=1e-6)
    back = p.unapply({STATE: out[STATE], ACTION: out[ACTION]})  # as a policy bundle walks back: state as context
    torch.testing.assert_close(back[ACTION], action, atol=1e-5, rtol=0)
    assert STATE not in back  # the dropped dims cannot be restored, so normalize's inverse never sees 3 of 9
    assert p.apply({ACTION: action})[ACTION].shape == action.shape  # an item without the feature passes


def test_select_dims_refuses_dims_past_the_feature_and_an_empty_list():
    with pytest.raises(TransformError, match=r"select_dims: dims \[0, 9\] reach past 'observation.state', "
                                             r"which has 9 dimensions"):
        build([{"type": "select_dims", "dims": [0, 9]}]).apply({STATE: torch.randn(4, 9)})
    with pytest.raises(ConfigError, match=r"'transforms\[0\].dims'"):
        build([{"type": "select_dims", "dims": []}])


# --- the pipeline --------------------------------------------------------------------------------------------

PIPELINE_YAML = f"""
- type: delta_actions
  dims: [0, 1, 2, 3, 4, 5]
- type: normalize
  features: {{{ACTION}: quantiles, {STATE}: mean_std, {TOP}: min_max}}
- {{type: pad_dim, keys: [{STATE}, {ACTION}], dim: 32}}
- {{type: pad_horizon, horizon: 50}}
- {{type: resize_pad, keys: [{TOP}, {WRIST}], size: [32, 32]}}
- {{type: random_crop, keys: [{TOP}, {WRIST}], size: [28, 28]}}
- {{type: color_jitter, keys: [{TOP}], brightness: 0.2, contrast: 0.2, saturation: 0.2, hue: 0.05}}
"""


@pytest.fixture
def pipeline(tmp_path, stats):
    path = tmp_path / "transforms.yaml"
    path.write_text(PIPELINE_YAML)
    return Pipeline.from_file(path, stats, seed=7)


def sample(batch: tuple[int, ...] = (), steps: int = 40) -> dict:
    return {STATE: torch.randn(*batch, 9), ACTION: torch.randn(*batch, steps, 7) * 2,
            TOP: torch.rand(*batch, 3, 48, 64), WRIST: torch.rand(*batch, 3, 40, 40), "task": "stack the cups"}


def test_pipeline_from_yaml_applies_in_order_and_unapplies_model_outputs(pipeline):
    assert [t["type"] for t in pipeline.to_dict()] == ["delta_actions", "normalize", "pad_dim", "pad_horizon",
                                                        "resize_pad", "random_crop", "color_jitter"]
    item = sample((2,))
    out = pipeline.apply(item)
    assert out[ACTION].shape == (2, 50, 32) and out[STATE].shape == (2, 32) and out[TOP].shape == (2, 3, 28, 28)
    assert out["action_is_pad"][:, 40:].all() and not out["action_is_pad"][:, :40].any()
    assert item[ACTION].shape == (2, 40, 7)  # the input is left as it was
    # Serving: the observation alone goes through, then the model's chunk (here: the training target) comes back.
    obs = pipeline.eval().apply({k: v for k, v in item.items() if k != ACTION})
    torch.testing.assert_close(obs[STATE], out[STATE])
    actions = pipeline.unapply({**obs, ACTION: out[ACTION]})[ACTION]
    assert actions.shape == (2, 50, 7)
    torch.testing.assert_close(actions[:, :40], item[ACTION], atol=2e-5, rtol=0)


def test_pipeline_works_on_unbatched_items_as_on_batched_ones(pipeline):
    item = sample((3,))
    pipeline.eval()  # deterministic, so each sample alone must give its row of the batch
    batched = pipeline.apply(item)
    for b in range(3):
        one = pipeline.apply({k: (v[b] if isinstance(v, torch.Tensor) else v) for k, v in item.items()})
        for key in (STATE, ACTION, TOP, WRIST, "action_is_pad"):
            torch.testing.assert_close(one[key], batched[key][b], atol=1e-6, rtol=0)


def test_serialised_pipeline_rebuilds_identically(pipeline, stats, tmp_path):
    save_file(pipeline.state_dict(), tmp_path / "stats.safetensors")
    (tmp_path / "transforms.json").write_text(json.dumps(pipeline.to_dict()))
    specs = json.loads((tmp_path / "transforms.json").read_text())
    rebuilt = Pipeline.from_state_dict(specs, load_file(tmp_path / "stats.safetensors"), seed=7)
    from_json = Pipeline.from_file(tmp_path / "transforms.json", stats, seed=7)
    assert rebuilt.to_dict() == from_json.to_dict() == pipeline.to_dict()
    item = sample((2,))
    for mode in ("train", "eval"):  # random draws from the same seed, then deterministic
        outs = [getattr(p, mode)().apply(item) for p in (pipeline, rebuilt, from_json)]
        for key in (STATE, ACTION, TOP, WRIST, "action_is_pad"):
            assert all(torch.equal(outs[0][key], o[key]) for o in outs[1:]), (mode, key)
        backs = [p.unapply(o)[ACTION] for p, o in zip((pipeline, rebuilt, from_json), outs)]
        assert all(torch.equal(backs[0], b) for b in backs[1:])


def test_an_export_carries_the_pipeline(pipeline, tmp_path):
    from longboat.checkpoint.export import read_export_config, save_export

    out = save_export(tmp_path / "export", torch.nn.Linear(2, 2), "toy", {}, assets=pipeline_assets(pipeline))
    assert {"transforms.json", "transforms.safetensors"} <= set(read_export_config(out)["assets"])
    served = load_pipeline(out)
    assert not served.training and served.to_dict() == pipeline.to_dict()
    item = sample((2,))
    assert torch.equal(served.apply(item)[TOP], pipeline.eval().apply(item)[TOP])
    (out / "transforms.safetensors").write_bytes(b"broken")
    with pytest.raises(ConfigError, match=r"transforms.safetensors: not a readable safetensors file"):
        load_pipeline(out)
    with pytest.raises(ConfigError, match=r"no transforms.json; the export carries no transform pipeline"):
        load_pipeline(tmp_path)


# --- errors and the registry ---------------------------------------------------------------------------------

@pytest.mark.parametrize("specs, message", [
    ([{"type": "normalise", "features": {ACTION: "mean_std"}}],
     r"^config: 'transforms\[0\].type': unknown transform 'normalise'; did you mean 'normalize'\? known transforms: "
     r"center_crop, color_jitter, .*resize_pad, select_dims \(one of your own registers through --plugin or the "
     r"config's plugins:\)$"),
    ([{"keys": [TOP]}], r"^config: 'transforms\[0\]' has no 'type'; known transforms: center_crop"),
    ({"type": "normalize"}, r"^config: 'transforms' must be a list of transforms, got dict$"),
    ([{"type": "resize_pad", "keys": [TOP], "sise": [2, 2]}],
     r"^config: 2 problems\n  missing required key 'transforms\[0\].size'\n  unknown key 'transforms\[0\].sise'"),
    ([{"type": "pad_horizon", "horizon": 0}], r"^config: 'transforms\[0\].horizon': Input should be greater than 0"),
    ([{"type": "normalize", "features": {"observation.effort": "mean_std"}}],
     r"^config: 'transforms\[0\]' \(normalize\) needs stats of 'observation.effort', which the dataset stats lack; "
     r"they have: action, observation.images.top, observation.state$"),
    ([{"type": "normalize", "features": {TOP: "quantiles"}}],
     r"^config: 'transforms\[0\]' \(normalize\) needs 'q01' of 'observation.images.top'; its stats have: count, "),
])
def test_bad_configs_fail_before_work_naming_the_key(stats, specs, message):
    with pytest.raises(ConfigError, match=message):
        build(specs, stats)


def test_a_missing_image_names_the_key_and_the_item_keys():
    with pytest.raises(TransformError, match=r"^resize_pad: the item has no 'observation.images.top'; it has: action$"):
        build([{"type": "resize_pad", "keys": [TOP], "size": [8, 8]}]).apply({ACTION: torch.zeros(3)})


def test_bad_yaml_names_the_file(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("- type: [unclosed")
    with pytest.raises(ConfigError, match=r"t.yaml: cannot read a transform list"):
        Pipeline.from_file(path)


def test_user_transforms_register_by_name(monkeypatch):
    monkeypatch.setattr(transforms_base, "_TRANSFORMS", transforms_base._TRANSFORMS.copy())  # leave no trace
    class ScaleConfig(StrictModel):
        key: str
        factor: float

    @register_transform("test_scale")
    class Scale(Transform):
        Config = ScaleConfig
        invertible = True

        def apply(self, item, generator=None):
            return {**item, self.cfg.key: item[self.cfg.key] * self.cfg.factor}

        def unapply(self, item):
            return {**item, self.cfg.key: item[self.cfg.key] / self.cfg.factor}

    assert "test_scale" in transform_names()
    p = build([{"type": "test_scale", "key": ACTION, "factor": 4.0}, {"type": "pad_horizon", "horizon": 3}])
    out = p.apply({ACTION: torch.ones(2, 1)})
    assert out[ACTION].tolist() == [[4.0], [4.0], [4.0]]
    assert p.unapply(out)[ACTION].tolist() == [[1.0], [1.0], [1.0]]
    assert register_transform("test_scale")(Scale) is Scale  # the same class again (a module imported twice)
    with pytest.raises(RegistryError, match=r"transform 'test_scale' registered twice: first by .*\.Scale "
                                            r"\(tests/data/robot/test_transforms.py:\d+\), again by .*\.Other "):
        @register_transform("test_scale")
        class Other(Scale):
            pass
