"""Tests mirror ``src/longboat``: the tests of ``<pkg>/.../<mod>.py`` live in ``tests/<pkg>/.../test_<mod>.py``, so a
test folder names a package of the source (or is one of the few folders that hold what tests read), and each is a
package of its own so that two folders may hold files of the same name. ``pytest -s tests/test_layout.py`` prints how
many modules have a test file at the mirrored path."""

from __future__ import annotations

from pathlib import Path

import longboat

SRC = Path(longboat.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent

# Test folders that name no package of src/longboat, each with what it holds.
NOT_PACKAGES = {
    "fixtures": "files the tests read (datasets, runs, tokenizers, templates) and the scripts that wrote them",
    "plugins": "code from outside the package, loaded by path as a user's plugin would be",
    "examples": "tests of the repository's examples/ folder, which is no package",
}


def _test_folders() -> list[Path]:
    """Every folder under tests/ except the allow-listed ones (and what they hold) and caches."""
    return sorted(p for p in TESTS.rglob("*") if p.is_dir() and not p.name.startswith((".", "__"))
                  and p.relative_to(TESTS).parts[0] not in NOT_PACKAGES)


def _modules() -> list[Path]:
    """The modules of src/longboat a test file can mirror: every .py file but packages' __init__ and __main__."""
    return sorted(p for p in SRC.rglob("*.py") if not p.name.startswith("__"))


def test_every_test_folder_names_a_package_of_the_source():
    strays = [str(folder.relative_to(TESTS)) for folder in _test_folders()
              if not (SRC / folder.relative_to(TESTS) / "__init__.py").is_file()]
    assert not strays, (f"tests/{', tests/'.join(strays)} name no package under src/longboat/: move the tests to the "
                        f"folder of the package they test, or allow-list the folder in NOT_PACKAGES with its reason")


def test_every_test_folder_is_a_package():
    bare = [str(folder.relative_to(TESTS)) for folder in _test_folders() if not (folder / "__init__.py").is_file()]
    assert not bare, (f"tests/{', tests/'.join(bare)} lack an __init__.py: without one a test file there must be "
                      f"named unlike every other test file")


def test_count_the_modules_with_a_mirrored_test_file():
    modules = _modules()
    mirrored = [m for m in modules if (TESTS / m.relative_to(SRC).with_name(f"test_{m.name}")).is_file()]
    print(f"\n{len(mirrored)} of {len(modules)} modules of src/longboat have a test file at the mirrored path "
          f"(tests/<pkg>/.../test_<mod>.py)")
    assert mirrored  # the count is reported, not held to a number; the walk must find the tests at all
