"""The pipeline: read from YAML, applied in order and unapplied on model outputs, batched or not, serialised
through safetensors and rebuilt identically; bad configs fail before work, naming the key."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from longboat.config.base import ConfigError
from longboat.data.robot.transforms import Pipeline
from tests.data.robot.transforms.conftest import ACTION, STATE, TOP, WRIST, build, sample


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


def test_bad_yaml_names_the_file(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("- type: [unclosed")
    with pytest.raises(ConfigError, match=r"t.yaml: cannot read a transform list"):
        Pipeline.from_file(path)
