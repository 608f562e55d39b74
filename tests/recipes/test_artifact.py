"""``open_artifact`` on files from elsewhere: an export's plugins are never imported (its architecture must be
registered by the user's ``--plugin``), and a config too large for the memory fails before allocating."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from longboat.cli.main import main
from longboat.models import footprint, registry
from tests.conftest import REPO

PLUGIN = REPO / "tests" / "plugins" / "marker_decoder.py"


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """The file the plugin writes when imported; the registry and the plugin's module restored afterwards."""
    path = tmp_path / "imported.txt"
    monkeypatch.setenv("LONGBOAT_TEST_PLUGIN_MARKER", str(path))
    monkeypatch.setattr(registry, "_MODELS", registry._MODELS.copy())
    before = set(sys.modules)
    yield path
    for name in set(sys.modules) - before:
        if name.startswith("longboat_plugin_"):
            del sys.modules[name]


@pytest.fixture
def plugin_export(chat_export, tmp_path):
    """The chat export under the architecture only ``marker_decoder.py`` registers, which it lists as its plugin."""
    out = tmp_path / "export"
    shutil.copytree(chat_export, out)
    meta = json.loads((out / "longboat_config.json").read_text())
    meta.update(arch="marker_decoder", plugins=[str(PLUGIN)])
    (out / "longboat_config.json").write_text(json.dumps(meta))
    return out


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi", "--max-new-tokens", "2"], ["serve", "--port", "0"]])
def test_an_exports_plugins_are_not_imported(plugin_export, marker, capsys, command):
    code, _, err = run_cli(capsys, command[0], str(plugin_export), *command[1:])
    assert code == 2 and not marker.exists()
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert "architecture 'marker_decoder' is not registered" in err
    assert str(PLUGIN) in err and "--plugin" in err


def test_the_users_plugin_registers_the_architecture(plugin_export, marker, capsys):
    code, out, _ = run_cli(capsys, "generate", str(plugin_export), "--prompt", "What", "--max-new-tokens", "3",
                           "--temperature", "0", "--plugin", str(PLUGIN))
    assert code == 0 and out.startswith("What") and marker.exists()


def test_a_run_directorys_export_imports_the_runs_own_plugins(plugin_export, marker, tmp_path):
    from longboat.recipes.artifact import open_artifact

    run = tmp_path / "run"
    run.mkdir()
    plugin_export.rename(run / "export")
    (run / "config.yaml").write_text(f"run_dir: {run}\nplugins: [{PLUGIN}]\ntrain: {{steps: 1}}\n")
    assert open_artifact(run).arch == "marker_decoder" and marker.exists()


def with_model_fields(export, out, **fields):
    shutil.copytree(export, out)
    meta = json.loads((out / "longboat_config.json").read_text())
    meta["model"].update(fields)
    (out / "longboat_config.json").write_text(json.dumps(meta))
    return out


def test_a_model_too_large_for_the_memory_fails_before_allocating(chat_export, tmp_path, capsys):
    wide = with_model_fields(chat_export, tmp_path / "wide", d_model=4_000_000, ffn_dim=16_000_000)
    code, _, err = run_cli(capsys, "generate", str(wide), "--prompt", "hi")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {wide / 'longboat_config.json'}: the model has ") and "parameters" in err
    assert "of memory available on cpu" in err


@pytest.mark.parametrize("fields", [{"d_model": 10**30}, {"n_layers": 10**12}])
def test_a_size_that_cannot_be_built_fails_in_one_line(chat_export, tmp_path, capsys, monkeypatch, fields):
    monkeypatch.setattr(footprint, "MAX_MODULES", 500)  # the refusal of a billion layers, sooner
    bad = with_model_fields(chat_export, tmp_path / "bad", **fields)
    code, _, err = run_cli(capsys, "generate", str(bad), "--prompt", "hi")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {bad / 'longboat_config.json'}: ")


@pytest.mark.parametrize("command", ["generate", "convert"])
def test_a_hugging_face_config_too_large_fails_before_loading(chat_hf_dir, tmp_path, capsys, command):
    wide = tmp_path / "hf"
    shutil.copytree(chat_hf_dir, wide)
    config = json.loads((wide / "config.json").read_text())
    config.update(hidden_size=4_000_000, intermediate_size=16_000_000)
    (wide / "config.json").write_text(json.dumps(config))
    args = ["generate", str(wide)] if command == "generate" else ["convert", "hf-to-longboat", str(wide),
                                                                   str(tmp_path / "out")]
    code, _, err = run_cli(capsys, *args)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {wide / 'config.json'}: the model has ") and not (tmp_path / "out").exists()
