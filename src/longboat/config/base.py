"""Typed configs: strict pydantic models, YAML files with inheritance, dotted command-line overrides."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from longboat.errors import LongboatError

INHERIT_KEY = "inherit"
T = TypeVar("T", bound=BaseModel)


class ConfigError(LongboatError, ValueError):
    """A config file, key or value is wrong; the message names it and what was expected."""


class StrictModel(BaseModel):
    """Base for every config: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def _known_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names valid at ``loc`` (a pydantic error location), walking nested models."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return []
        current = fields[part].annotation
        # Optional[Model] / Model | None: take the model member.
        for arg in getattr(current, "__args__", ()) or ():
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                current = arg
    return list(getattr(current, "model_fields", {}))


def format_validation_error(model: type[BaseModel], err: ValidationError, source: str, prefix: str = "") -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in ((prefix,) if prefix else ()) + tuple(e["loc"]))
        if e["type"] == "extra_forbidden":
            known = _known_keys(model, e["loc"])
            close = difflib.get_close_matches(str(e["loc"][-1]), known, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else (f"; valid keys: {', '.join(known)}" if known else "")
            lines.append(f"unknown key '{key}'{hint}")
        elif e["type"] == "missing":
            lines.append(f"missing required key '{key}'")
        else:
            lines.append(f"'{key}': {e['msg']} (got {e.get('input')!r})")
    if len(lines) == 1:  # the usual case: one line names the file, the key and what is wrong
        return f"{source}: {lines[0]}"
    return f"{source}: {len(lines)} problems\n" + "\n".join(f"  {line}" for line in lines)


def validate(model: type[T], data: dict, source: str = "config", prefix: str = "") -> T:
    """Validate ``data`` as ``model``; errors name each key (under ``prefix``) and the closest valid key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{prefix or 'config'}' must be a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(model, err, source, prefix)) from None


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (PyYAML's own message spans several, with context)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict:
    """Read a YAML config, resolving ``inherit: other.yaml`` (relative to the file) recursively."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    if path in _seen:
        raise ConfigError(f"{path}: inheritance cycle through {' -> '.join(map(str, _seen))}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    parents = data.pop(INHERIT_KEY, None)
    if parents is None:
        return data
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(x, str) and x for x in parents):
        raise ConfigError(f"{path}: '{INHERIT_KEY}' must be a config path or a list of them, got {parents!r}")
    merged: dict = {}
    for parent in parents:
        merged = deep_merge(merged, load_yaml(path.parent / parent, _seen + (path,)))
    return deep_merge(merged, data)


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override '{item}': expected key=value, e.g. train.lr=3e-4")
    key, raw = item.split("=", 1)
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override '{item}': empty key part")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string; a user means the number
        try:
            value = float(value) if any(c in value.lower() for c in ".e") else int(value)
        except ValueError:
            pass
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` strings; values are parsed as YAML (numbers, lists, null)."""
    data = dict(data)
    for item in overrides:
        parts, value = parse_override(item)
        node = data
        for p in parts[:-1]:
            child = node.get(p)
            child = dict(child) if isinstance(child, dict) else {}
            node[p] = child
            node = child
        node[parts[-1]] = value
    return data


def dump_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
