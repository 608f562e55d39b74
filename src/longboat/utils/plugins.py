"""User code that registers tasks, models or transforms, imported before a config is resolved.

A run config's ``plugins:`` names importable modules (``my_pkg.policies``) or Python files (``plugins/net.py``,
relative to the config file, else to the working directory). Installed packages can register the same way
through the ``longboat.plugins`` entry-point group. Each is imported once per process; an import that fails
stops the run with an error naming the plugin.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import traceback
from pathlib import Path

from longboat.errors import LongboatError

ENTRY_POINT_GROUP = "longboat.plugins"
_entry_points_loaded = False


class PluginError(LongboatError):
    """A plugin could not be found or imported."""


def _failure(name: str, err: BaseException) -> PluginError:
    where = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
    at = f" ({where.filename}:{where.lineno})" if where else ""
    return PluginError(f"plugin '{name}': import failed: {type(err).__name__}: {err}{at}")


def _import_file(path: Path, name: str) -> None:
    module_name = f"longboat_plugin_{abs(hash(str(path)))}_{path.stem}"
    if module_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise _failure(name, e) from e


def load_plugins(names: list[str], base_dir: str | Path | None = None) -> list[str]:
    """Import the installed entry points (once) and each named module or ``.py`` file.

    Returns the names with files made absolute, so a saved config finds them again from anywhere.
    """
    load_entry_points()
    resolved = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugins: expected module names or .py paths, got {name!r}")
        if name.endswith(".py"):
            candidates = [Path(base_dir) / name] if base_dir is not None else []
            path = next((p for p in [*candidates, Path(name)] if p.is_file()), None)
            if path is None:
                raise PluginError(f"plugin '{name}': no such file" + (f" (looked in {base_dir} and .)" if base_dir else ""))
            _import_file(path.resolve(), name)
            resolved.append(str(path.resolve()))
            continue
        resolved.append(name)
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name or name.startswith(f"{e.name}."):
                raise PluginError(f"plugin '{name}': no module of that name is importable") from None
            raise _failure(name, e) from e
        except Exception as e:
            raise _failure(name, e) from e
    return resolved


def with_plugins(plugins: list[str], fn):
    """``fn()`` once ``plugins`` are imported here: what a worker process runs first, so that what the plugins
    register (a simulator, say) is known there as in the process that started it."""
    load_plugins(plugins)
    return fn()


def load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:
            raise _failure(f"{ep.name} = {ep.value} (entry point)", e) from e
