from pathlib import Path

import pytest

from longboat.config.base import ConfigError, apply_overrides, load_yaml
from longboat.recipes.config import load_run_config, resolve

# Policy configs read their model's features from a dataset: tests/tasks/test_policy.py loads them against one.
# Eval configs are not run configs: tests/eval/test_results.py loads them.
QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "pretrain" / "quickstart.yaml"
CONFIGS = sorted(p for p in Path(__file__).resolve().parents[2].joinpath("configs").rglob("*.yaml")
                 if p.parent.name not in ("policy", "eval"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_config_file_loads(path):
    # Base files are partial: complete them with the required fields a child would give.
    required = ["run_dir=x", "train.steps=1", "data.tokenizer=t", "data.paths=[p]", "data.seq_len=8"]
    overrides = required if path.stem == "base" else []
    if "hf" in load_yaml(path).get("model", {}):
        # The HF directory is made by the recipe's first step; the same architecture stands in for it here.
        overrides = [*overrides, "model={arch: decoder, preset: smollm2-135m}"]
    resolved = load_run_config(path, overrides)
    assert resolved.cfg.train.steps > 0
    assert isinstance(resolved.model, resolved.spec.config)
    assert resolved.spec.config.model_validate(resolved.model.model_dump()) == resolved.model


def test_configs_exist():
    assert len(CONFIGS) >= 3


def test_inheritance_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text("a: {b: 1, c: 2}\nlist: [1, 2]\n")
    (tmp_path / "child.yaml").write_text("inherit: base.yaml\na: {c: 3}\n")
    data = load_yaml(tmp_path / "child.yaml")
    assert data == {"a": {"b": 1, "c": 3}, "list": [1, 2]}
    over = apply_overrides(data, ["a.b=5e-4", "list=[3]", "new.deep.key=null", "s=hello"])
    assert over == {"a": {"b": 5e-4, "c": 3}, "list": [3], "new": {"deep": {"key": None}}, "s": "hello"}
    assert data["a"]["b"] == 1  # overrides do not mutate their input


def test_inheritance_cycle(tmp_path):
    (tmp_path / "a.yaml").write_text("inherit: b.yaml\n")
    (tmp_path / "b.yaml").write_text("inherit: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_yaml(tmp_path / "a.yaml")


def test_missing_file_names_it(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_yaml(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lrr=1", "unknown key 'train.lrr'"),
        ("train.optimizer.lrr=1", "unknown key 'train.optimizer.lrr'; did you mean 'lr'"),
        ("model.n_layer=2", "unknown key 'model.n_layer'; did you mean 'n_layers'"),
        ("data.seq_lenn=2", "unknown key 'data.seq_lenn'; did you mean 'seq_len'"),
        ("chekpoint.every=2", "unknown key 'chekpoint'; did you mean 'checkpoint'"),
        ("train.steps=-1", "'train.steps': Input should be greater than 0"),
        ("train.dtype=fp8", "'train.dtype'"),
        ("task=nope", "unknown task 'nope'; known tasks: diffusion, policy, preference, pretrain"),
        ("model.preset=nope", "unknown model preset 'nope'"),
        ("model.arch=nope", "unknown model architecture 'nope'"),
    ],
)
def test_bad_keys_fail_with_the_key_named(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_run_config(QUICKSTART, [override])


def test_override_must_be_key_value():
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["train.steps"])


def test_resolved_yaml_round_trips(tmp_path):
    resolved = load_run_config(QUICKSTART, ["model.n_layers=2"])
    path = tmp_path / "config.yaml"
    path.write_text(resolved.to_yaml())
    again = load_run_config(path)
    assert again.model == resolved.model and again.model.n_layers == 2
    assert again.cfg.train == resolved.cfg.train
    assert again.cfg.model.preset is None and again.cfg.model.fields["n_layers"] == 2  # the preset is expanded
    assert "preset" not in path.read_text().split("model:")[1].split("\ndata:")[0]
    assert resolve({"run_dir": "x", "train": {"steps": 1}, "data": {"tokenizer": "t", "paths": ["p"], "seq_len": 8}})


def test_a_truncated_yaml_file_is_named_in_one_line(tmp_path):
    path = tmp_path / "cut.yaml"
    path.write_text("train:\n  steps: [1")
    with pytest.raises(ConfigError) as err:
        load_yaml(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "line 2" in message
