"""Outputs written whole or not at all, never at the cost of what was there.

A command fills a hidden sibling of its target (a directory, a file, or files that belong together) and renames
it into place, so a crash, Ctrl-C or SIGTERM leaves the old target or the new one, never half of either. An
existing target is replaced only when the caller allows it, and never when it is, holds or lies inside what the
command reads, a run directory or a checkpoint: deleting those loses training. A run's own export directories
(``<run>/export``, ``<run>/hf``, ``<run>/adapter``) are the exception, since training rewrites them at the end
of every run.
"""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from longboat.errors import LongboatError, WorldError
from longboat.utils.interrupt import signals_held, sigterm_raises

RUN_CONFIG = "config.yaml"
RUN_CHECKPOINTS = "checkpoints"
CHECKPOINT_MARKER = "COMPLETE"  # checkpoint.dcp.COMPLETE_MARKER; utils sits below checkpoint and cannot import it
RUN_EXPORTS = ("export", "hf", "adapter")


class OutputError(LongboatError):
    """An output cannot be written without destroying something worth keeping."""


class OutputPlaceError(WorldError, OutputError):
    """The file system refuses the place an output goes: a parent that is a file, a read-only or virtual file
    system, no permission."""


def is_run_dir(path: Path) -> bool:
    return (path / RUN_CONFIG).is_file() and (path / RUN_CHECKPOINTS).is_dir()


def is_checkpoint(path: Path) -> bool:
    return (path / CHECKPOINT_MARKER).is_file()


def is_run_export(path: Path) -> bool:
    """``<run>/export``, ``<run>/hf`` or ``<run>/adapter``: the directories training itself writes (the run may
    have no checkpoints)."""
    return path.name in RUN_EXPORTS and (path.parent / RUN_CONFIG).is_file()


def check_output(target: str | os.PathLike, overwrite: bool | None = False,
                 sources: Iterable[str | os.PathLike] = ()) -> None:
    """Raise :class:`OutputError` unless a directory may be written at ``target``.

    A missing target or an empty directory may always be written. An existing one may be replaced when
    ``overwrite`` is true; ``None`` allows only a run's own export directory (what training rewrites).
    Whatever ``overwrite`` says, a target that is, holds or lies inside one of ``sources`` (what is being
    read), a run directory or a checkpoint is refused.
    """
    shown = Path(target)
    if not _occupied(shown):
        return
    real = shown.resolve()
    why = _protected(real, [Path(s).resolve() for s in sources])
    if why:
        raise OutputError(f"{shown}: {why}; refusing to replace it, choose another output directory")
    if overwrite or (overwrite is None and is_run_export(real)):
        return
    raise OutputError(f"{shown} already exists and is not empty; pass --overwrite to replace it, "
                      f"or choose another output directory")


@contextmanager
def staged_output(target: str | os.PathLike, overwrite: bool | None = False,
                  sources: Iterable[str | os.PathLike] = ()) -> Iterator[Path]:
    """Check ``target`` (see :func:`check_output`), yield an empty hidden sibling to fill, then swap it in.

    On an error the sibling is removed and ``target`` is left as it was.
    """
    sources = list(sources)
    check_output(target, overwrite, sources)
    path = Path(os.path.abspath(target))  # lexical: a symlinked target is replaced as a link, its target kept
    with sigterm_raises():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            stage = _sibling(path, "partial")
            stage.mkdir()  # not mkdtemp: the output keeps the umask's permissions, not 0700
        except OSError as e:
            raise _cannot_write(target, e) from None
        try:
            yield stage
            check_output(target, overwrite, sources)  # the target may have changed while the output was written
            _swap_in(stage, path)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise


def check_file_output(target: str | os.PathLike, overwrite: bool = False,
                      sources: Iterable[str | os.PathLike] = ()) -> None:
    """Raise :class:`OutputError` unless a file may be written at ``target``.

    A missing target may always be written, an existing file when ``overwrite`` is true, a directory never.
    Whatever ``overwrite`` says, a file that is one of ``sources`` (what is being read), lies inside one of
    them or inside a checkpoint is refused.
    """
    shown = Path(target)
    if shown.is_dir():
        raise OutputError(f"{shown}: is a directory; expected the path of a file to write")
    if not (shown.exists() or shown.is_symlink()):
        return
    real = shown.resolve()
    for source in (Path(s).resolve() for s in sources):
        if real == source:
            raise OutputError(f"{shown}: is an input of this command; refusing to replace it, choose another output")
        if source in real.parents:
            raise OutputError(f"{shown}: is inside {source}, which this command reads; choose another output")
    for parent in real.parents:
        if is_checkpoint(parent):
            raise OutputError(f"{shown}: is inside the checkpoint {parent}; choose another output")
    if not overwrite:
        raise OutputError(f"{shown} already exists; pass --overwrite to replace it, or choose another output")


@contextmanager
def staged_file(target: str | os.PathLike, overwrite: bool = False,
                sources: Iterable[str | os.PathLike] = ()) -> Iterator[Path]:
    """Check ``target`` (see :func:`check_file_output`), yield an empty hidden sibling file to fill, then rename
    it over ``target``. On any exception (Ctrl-C and SIGTERM included) the sibling is removed and ``target`` is
    left as it was."""
    with staged_files([target], overwrite, sources) as (stage,):
        yield stage


@contextmanager
def staged_files(targets: Iterable[str | os.PathLike], overwrite: bool = False,
                 sources: Iterable[str | os.PathLike] = ()) -> Iterator[list[Path]]:
    """:func:`staged_file` for files that belong together (``NAME.bin`` and ``NAME.idx``): each is checked
    before anything is written, and all are renamed into place only once all are complete."""
    targets, sources = [Path(t) for t in targets], list(sources)
    for target in targets:
        check_file_output(target, overwrite, sources)
    stages: list[Path] = []
    with sigterm_raises():
        try:
            for target in targets:
                path = Path(os.path.abspath(target))
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    stages.append(_sibling(path, "partial"))
                    stages[-1].touch(exist_ok=False)
                except OSError as e:
                    raise _cannot_write(target, e) from None
            yield stages
            for target in targets:  # a target may have appeared while the output was written
                check_file_output(target, overwrite, sources)
            with signals_held():  # all renamed, or none
                for stage, target in zip(stages, targets):
                    os.replace(stage, os.path.abspath(target))
        except BaseException:
            for stage in stages:
                stage.unlink(missing_ok=True)
            raise


def replace_file(path: str | os.PathLike, text: str | bytes) -> Path:
    """Write ``text`` to a file this command owns (a run's ``config.yaml``, an evaluation's ``run.json`` or
    report): into a hidden sibling first, then renamed over ``path``, so a reader or a crash sees the old file or
    the new one, never half of either."""
    path = Path(path)
    stage = _sibling(path, "partial")
    try:
        stage.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
        os.replace(stage, path)
    except BaseException:
        stage.unlink(missing_ok=True)
        raise
    return path


def check_place(target: str | os.PathLike) -> None:
    """Raise :class:`OutputPlaceError` unless something can be created beside ``target`` (its missing parents are
    made): for a command that writes in its own way, checked before its long work starts."""
    path = Path(os.path.abspath(target))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = _sibling(path, "probe")
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise _cannot_write(target, e) from None


def _cannot_write(target: str | os.PathLike, e: OSError) -> OutputPlaceError:
    """The error for an output the file system refused, naming the file that stands where a directory must be."""
    why = e.strerror or str(e)
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        for parent in Path(os.path.abspath(target)).parents:
            if parent.exists() and not parent.is_dir():
                why = f"{parent} is a file, not a directory"
                break
    return OutputPlaceError(f"{target}: cannot write here ({why})")


def _swap_in(stage: Path, target: Path) -> None:
    """Rename ``stage`` to ``target``; an old target is moved aside first and removed only once the new is in."""
    if not _occupied(target):
        os.replace(stage, target)  # over nothing or an empty directory
        return
    aside = _sibling(target, "old")
    with signals_held():  # a stop signal between the renames would leave no target, or the old one aside
        os.rename(target, aside)
        try:
            os.rename(stage, target)
        except BaseException:
            os.rename(aside, target)
            raise
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside)
        else:
            aside.unlink()


def _sibling(path: Path, kind: str) -> Path:
    """A fresh hidden name beside ``path``, on its file system, so renames between them are atomic."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.{kind}")


def _occupied(path: Path) -> bool:
    """Something is there that writing would replace: a file, a link, or a directory with entries."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        return True
    return path.is_dir() and any(path.iterdir())


def _protected(real: Path, sources: list[Path]) -> str | None:
    """Why the existing ``real`` must not be replaced, or None."""
    run_export = is_run_export(real)
    for source in sources:
        if real == source:
            return "is the source this command reads"
        if real in source.parents:
            return f"holds {source}, which this command reads"
        if source in real.parents and not run_export:
            return f"is inside {source}, which this command reads"
    for place, name in ((Path.cwd(), "the current directory"), (Path.home(), "your home directory")):
        if real == place or real in place.parents:
            return f"is or holds {name}"
    if is_run_dir(real):
        return f"is a run directory ({RUN_CONFIG} and {RUN_CHECKPOINTS}/)"
    if is_checkpoint(real):
        return f"is a checkpoint (has {CHECKPOINT_MARKER})"
    for parent in real.parents:
        if is_run_dir(parent) and not (run_export and parent == real.parent):
            return f"is inside the run directory {parent}"
        if is_checkpoint(parent):
            return f"is inside the checkpoint {parent}"
    if real.is_dir():
        for root, dirs, _ in os.walk(real):  # links are not followed: what they point to is not deleted
            for name in dirs:
                inner = Path(root) / name
                if inner.is_symlink():
                    continue
                if is_run_dir(inner):
                    return f"holds the run directory {inner}"
                if is_checkpoint(inner):
                    return f"holds the checkpoint {inner}"
    return None


@contextmanager
def cache_directory(final: Path) -> Iterator[Path]:
    """A fresh temporary directory beside ``final`` to build a cache in, renamed to ``final`` when the block ends
    without an error and removed when it raises: a reader never sees half a cache. When another process published the
    same cache first, its copy stays (a cache's name is the hash of what it holds, so the two are identical)."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir(parents=True)
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
