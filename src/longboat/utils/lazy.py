"""Package names that load from their submodules on first use (PEP 562), so importing one light submodule does not
pay for the heavy ones beside it."""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each name to the submodule defining it.

    No name may be its own submodule's: importing ``package.name`` sets the package's attribute ``name`` to that
    submodule, so whether ``from package import name`` gave the module or the object would hang on import order.
    """
    clashes = sorted(name for name, module in exports.items() if name == module)
    if clashes:
        raise ValueError(f"{package}: {clashes} would be shadowed by the submodules of the same names")

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{exports[name]}"), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
