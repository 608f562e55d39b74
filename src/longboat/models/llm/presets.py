"""Named model sizes shipped with the package as YAML (fields of ``DecoderConfig``)."""

from __future__ import annotations

from importlib import resources

import yaml

from longboat.config.base import ConfigError

_DIR = "presets"


def preset_names() -> list[str]:
    root = resources.files("longboat.models.llm") / _DIR
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_preset(name: str) -> dict:
    """The config dict of a preset, e.g. ``load_preset("llama3.2-1b")``."""
    known = preset_names()
    if name not in known:
        raise ConfigError(f"unknown model preset '{name}'; known: {', '.join(known)}")
    return yaml.safe_load((resources.files("longboat.models.llm") / _DIR / f"{name}.yaml").read_text())
