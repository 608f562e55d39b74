"""Lazy package exports: names load with their submodules, and a name never collides with a submodule's."""

from __future__ import annotations

import subprocess
import sys
import types
from importlib import import_module

import pytest

from longboat.utils.lazy import lazy_exports

LAZY_PACKAGES = ["longboat.distributed", "longboat.data.robot", "longboat.sim"]


def test_a_name_cannot_be_its_own_submodules():
    # Importing pkg.parallelize sets pkg.parallelize to the module: the export would depend on import order.
    with pytest.raises(ValueError, match=r"\['parallelize'\] would be shadowed"):
        lazy_exports("pkg", {"parallelize": "parallelize", "build_mesh": "mesh"})


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_export_loads_as_the_object_it_names(package):
    module = import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert not isinstance(value, types.ModuleType) and value.__name__ == name, f"{package}.{name}"


def test_the_config_module_loads_without_the_device_mesh():
    code = "import sys, longboat.distributed.config; assert 'longboat.distributed.mesh' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_training_without_a_pipeline_does_not_load_torchs_pipelining():
    """torch.distributed.pipelining imports torch's compiler (about a second of every process's start-up)."""
    code = "import sys, longboat.recipes.train; assert 'torch.distributed.pipelining' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
