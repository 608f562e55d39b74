"""Named things a longboat part looks up (tasks, models, runners, ...): one small registry class behind each.

A name registered twice by different code is an error naming both places, so a plugin cannot silently replace a
built-in (or another plugin); an unknown name is an error listing the known ones and a close match. The same
definition registered again (a module imported a second time, under another name) replaces the first quietly.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import sys
from pathlib import Path
from typing import Callable, Generic, Iterator, TypeVar

from longboat.errors import LongboatError

T = TypeVar("T")
_MISSING = object()


class RegistryError(LongboatError, ValueError):
    """A name registered twice, or a registration the registry refuses."""


def source_of(obj: object) -> str | None:
    """Where ``obj`` (a class or function) is defined, as ``module.Qualname (file:line)``; None when unknowable."""
    found = _definition(obj)
    if found is None:
        return None
    name, file, line = found
    return f"{name} ({_short(file)}:{line})" if file else name


def _definition(obj: object) -> tuple[str, str | None, int | None] | None:
    """(``module.Qualname``, file, line) of the class or function ``obj`` (file and line None where unknowable)."""
    target = obj.func if isinstance(obj, functools.partial) else obj
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)):
        return None
    try:
        return f"{module}.{qualname}", inspect.getsourcefile(target), inspect.getsourcelines(target)[1]
    except (OSError, TypeError):
        return f"{module}.{qualname}", None, None


def caller_source(stacklevel: int = 1) -> str:
    """``file:line`` of the code ``stacklevel`` frames above the caller of this function."""
    frame = sys._getframe(stacklevel + 1)
    return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno}"


def _short(file: str | None) -> str:
    """A path relative to the working directory when it lies under it, else as given."""
    if not file:
        return "<unknown>"
    try:
        return str(Path(file).resolve().relative_to(Path.cwd()))
    except ValueError:
        return file


class Registry(Generic[T]):
    """Name -> object for one ``kind`` ("task", "runner", ...), in registration order.

    ``error`` is the class an unknown name raises (the subsystem's own, a ``LongboatError``); ``known`` is the
    label before the list of names in that message ("known tasks"), ``hint`` a remark after it (how to add one).
    """

    def __init__(self, kind: str, known: str = "known", error: type[LongboatError] = RegistryError,
                 hint: str | None = None):
        self.kind, self.known, self.error, self.hint = kind, known, error, hint
        self._items: dict[str, T] = {}
        self._sources: dict[str, str] = {}

    def register(self, name: str, obj: T, source: str | None = None, stacklevel: int = 1) -> T:
        """Add ``obj`` as ``name``. ``source`` says where it comes from (default: where ``obj`` is defined, else the
        code ``stacklevel`` frames above the caller)."""
        if not isinstance(name, str) or not name:
            raise RegistryError(f"a {self.kind} needs a non-empty name, got {name!r}")
        source = source or source_of(obj) or caller_source(stacklevel)
        if name in self._items and not self._same(name, obj, source):
            raise RegistryError(f"{self.kind} '{name}' registered twice: first by {self._sources[name]}, "
                                f"again by {source}; give one of them another name")
        self._items[name] = obj
        self._sources[name] = source
        return obj

    def _same(self, name: str, obj: T, source: str) -> bool:
        """Whether ``obj`` is what ``name`` holds, or the same definition run again: the same source, or a class or
        function of the same name, file and line (its module imported a second time, under another name)."""
        old = self._items[name]
        if old is obj or self._sources[name] == source:
            return True
        here, there = _definition(old), _definition(obj)
        return (here is not None and there is not None and here[1] is not None and here[1:] == there[1:]
                and here[0].rpartition(".")[2] == there[0].rpartition(".")[2])

    def decorator(self, name: str, prepare: Callable[[T], None] | None = None) -> Callable[[T], T]:
        """A decorator that registers what it decorates as ``name`` (after ``prepare(obj)``, e.g. setting its name)
        and returns it unchanged."""
        def wrap(obj: T) -> T:
            if prepare is not None:
                prepare(obj)
            return self.register(name, obj)
        return wrap

    def unknown(self, name: object) -> str:
        """The message for an unknown ``name``: the close match, if any, and the known names."""
        close = difflib.get_close_matches(str(name), list(self._items), n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        after = f" ({self.hint})" if self.hint else ""
        return f"unknown {self.kind} {name!r}; {hint}{self.known}: {', '.join(self.names()) or 'none'}{after}"

    def get(self, name: str, default: object = _MISSING) -> T:
        """The object registered as ``name``; an unknown one raises ``error`` (or returns ``default`` if given)."""
        if isinstance(name, str) and name in self._items:
            return self._items[name]
        if default is not _MISSING:
            return default
        raise self.error(self.unknown(name))

    def source(self, name: str) -> str:
        """Where ``name`` was registered from."""
        self.get(name)
        return self._sources[name]

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._items)

    def values(self) -> list[T]:
        return list(self._items.values())

    def items(self) -> list[tuple[str, T]]:
        return list(self._items.items())

    def copy(self) -> "Registry[T]":
        """An independent registry holding the same entries (tests swap one in to leave no trace)."""
        out = Registry(self.kind, self.known, self.error, self.hint)
        out._items, out._sources = dict(self._items), dict(self._sources)
        return out

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __setitem__(self, name: str, obj: T) -> None:
        """Replace (or add) ``name`` without the duplicate check: for tests that swap an entry."""
        self._items[name] = obj
        self._sources[name] = source_of(obj) or caller_source()

    def __delitem__(self, name: str) -> None:
        del self._items[name]
        del self._sources[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        """The names in registration order."""
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._items)})"
