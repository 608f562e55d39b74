"""``policy.json`` from a shared export: every malformed manifest is one error naming the file and the key."""

import json

import pytest

from longboat.cli.main import main
from longboat.config.base import ConfigError
from longboat.models.policy.manifest import read_policy_manifest
from tests.serving.conftest import mlp_export

GOOD = {"format_version": 1, "wire_keys": {"state": "observation.state"}, "fps": 10,
        "input_features": {"observation.state": {"shape": [8], "dtype": "float32", "model_shape": [8]}},
        "tasks": ["push"], "prompt": None, "written_by_a_newer_version": True}


@pytest.mark.parametrize("change, message", [
    ({"wire_keys": None}, "'wire_keys': Input should be a valid dictionary"),
    ({"wire_keys": "state"}, "'wire_keys': Input should be a valid dictionary"),
    ({"fps": float("nan")}, "'fps': Value error, expected a finite positive number"),
    ({"fps": -1}, "'fps': Value error, expected a finite positive number"),
    ({"input_features": {"observation.state": {"shape": []}}}, "'input_features.observation.state.shape'"),
    ({"input_features": {"observation.state": {"shape": [-3]}}}, "sizes must be positive"),
    ({"input_features": {"observation.state": {}}}, "missing required key 'input_features.observation.state.shape'"),
    ({"prompt": {"max_prompt_len": 0}}, "'prompt.max_prompt_len': Input should be greater than 0"),
    ({"tasks": [1]}, "'tasks.0': Input should be a valid string"),
    ({"format_version": 2}, "format_version 2 is not one this longboat reads"),
])
def test_a_malformed_manifest_names_the_key(change, message):
    content = json.dumps({**GOOD, **change}).encode()
    if change.get("wire_keys", "") is None:
        content = json.dumps({k: v for k, v in GOOD.items() if k != "wire_keys"}).encode()
        message = "missing required key 'wire_keys'"
    with pytest.raises(ConfigError, match="^export/policy.json: ") as err:
        read_policy_manifest(content, "export/policy.json")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe{}", "not UTF-8"), (b"[" * 100_000, "nested too deeply"), (b"[1]", "must be a mapping")])
def test_a_manifest_that_is_not_a_json_object_is_refused(content, message):
    with pytest.raises(ConfigError, match=message):
        read_policy_manifest(content, "policy.json")


def test_a_good_manifest_keeps_what_it_does_not_read():
    manifest = read_policy_manifest(json.dumps(GOOD), "policy.json")
    assert manifest["wire_keys"] == GOOD["wire_keys"] and manifest["written_by_a_newer_version"] is True
    assert manifest["input_features"]["observation.state"]["shape"] == [8]


def test_serve_and_eval_refuse_an_export_without_wire_keys_in_one_line(tmp_path, capsys):
    export = mlp_export(tmp_path / "export", state_dim=8)
    manifest = json.loads((export / "policy.json").read_text())
    del manifest["wire_keys"]
    (export / "policy.json").write_text(json.dumps(manifest))
    assert main(["serve", str(export), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "policy.json: missing required key 'wire_keys'" in err, err
