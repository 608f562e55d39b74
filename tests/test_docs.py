"""The project's map stays true: ``docs/architecture.md`` names every module of ``src/longboat``, and no module that
is gone."""

import re
from pathlib import Path

import longboat

SRC = Path(longboat.__file__).resolve().parent
MAP = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _modules() -> set[str]:
    return {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
            if p.name != "__init__.py" or p.read_text().lstrip().startswith(('"""', "'''"))}


def test_the_map_names_every_module():
    named = set(re.findall(r"^- `([\w/]+\.py)`", MAP.read_text(), re.M))
    missing, gone = sorted(_modules() - named), sorted(named - _modules())
    assert not missing and not gone, (f"docs/architecture.md does not name {missing}" if missing else
                                      f"docs/architecture.md names modules that no longer exist: {gone}")


def test_links_between_the_readme_and_the_docs_lead_somewhere():
    root = MAP.parents[1]
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.relative_to(root)} links to {target}, which is missing"
