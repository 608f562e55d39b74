"""Imports point down the layers: a package imports only from its own layer or below, read from the source with
``ast`` (imports inside functions count too), so a new upward import fails here rather than as a cycle later."""

from __future__ import annotations

import ast
from pathlib import Path

import longboat

SRC = Path(longboat.__file__).resolve().parent

# Top to bottom; a package may import from its own layer or below. serving/ and sim/ sit beside tasks/ so that
# eval/ may use them.
LAYERS = [
    {"cli", "__main__"},
    {"recipes"},
    {"eval"},
    {"tasks", "serving", "sim"},
    {"trainer", "distributed", "checkpoint"},
    {"models"},
    {"data"},
    {"config", "utils", "errors", ""},  # "" is ``longboat`` itself (its __version__)
]
RANK = {package: len(LAYERS) - i for i, layer in enumerate(LAYERS) for package in layer}

# Imports a layer allows but the design does not: evaluation serves and scores any policy, so it takes nothing from
# the training tasks or the recipes, nor do the simulators it steps; distributed/ parallelizes any model and the
# trainer drives it, never the reverse.
FORBIDDEN = {
    ("eval", "recipes"),
    ("eval", "tasks"),
    ("sim", "tasks"),  # simulators and their experts serve recording and evaluation, never a training task
    ("distributed", "trainer"),
}

# What a package outside models/ may import from models/: the package, the registry and the contracts every family
# meets, never one architecture's own modules (those are reached through the registry, by name).
MODELS_ALLOWED = {
    "longboat.models",  # the package: build_model, get_model and the registry it fills
    "longboat.models.registry",  # ModelSpec and lookups by architecture name
    "longboat.models.lora",  # LoRA wraps any nn.Linear, whichever family holds it
    "longboat.models.peft_adapter",  # PEFT adapter files for any registered family
    "longboat.models.footprint",  # parameter and memory counts of any module
    "longboat.models.policy",  # the package: Policy, PolicyConfig, keyed randomness (re-exported contracts)
    "longboat.models.policy.base",  # Policy / PolicyConfig: the contract every policy family meets
    "longboat.models.policy.manifest",  # the policy manifest and POLICY_SPEC: a file format, not a model
    "longboat.models.generative.keyed_random",  # keyed noise any generative task, policy and data pipeline share
    "longboat.models.generative.flow_matching",  # the flow-matching objective and samplers, for any family
    "longboat.models.generative.ddpm",  # the DDPM/DDIM schedule, for any family
    "longboat.models.llm.generation",  # sampling loop over any model with a KV cache, not the decoder itself
    "longboat.models.contracts",  # ModelHooks / ExpertSets: what the engine asks of a model, declared by its spec
}

# Known upward imports that need a package move rather than an import fix; each names what removes it.
KNOWN: set[str] = set()


def module_name(path: Path, root: Path = SRC) -> str:
    parts = ["longboat", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path = SRC) -> bool:
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()


def imports(path: Path, root: Path = SRC) -> list[tuple[int, str]]:
    """Every ``longboat`` module ``path`` imports, anywhere in the file, with its line; ``from pkg import sub`` names
    the submodule when ``sub`` is one."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if target.startswith("longboat") and is_module(sub, root) else target))
    return [(line, name) for line, name in found if name == "longboat" or name.startswith("longboat.")]


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def violations() -> list[str]:
    found, seen = [], set()
    for path in sorted(SRC.rglob("*.py")):
        me = module_name(path)
        mine = package_of(me)
        for line, target in imports(path):
            theirs = package_of(target)
            where = f"{me}:{line} -> {target}"
            if where in seen:
                continue
            seen.add(where)
            if mine not in RANK or theirs not in RANK:
                found.append(f"{where} (package not placed in LAYERS)")
            elif RANK[theirs] > RANK[mine]:
                found.append(f"{where} ({mine} is below {theirs})")
            elif (mine, theirs) in FORBIDDEN:
                found.append(f"{where} ({mine} must not import {theirs})")
            elif mine != "models" and theirs == "models" and target not in MODELS_ALLOWED:
                found.append(f"{where} (one architecture's module: go through longboat.models)")
    return found


def test_imports_point_down_the_layers():
    found = [v for v in violations() if v.split(" (")[0] not in KNOWN]
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_known_exceptions_are_still_real():
    """An exception that no longer occurs is dropped from KNOWN, so it cannot hide a new import later."""
    current = {v.split(" (")[0] for v in violations()}
    assert not KNOWN - current, f"no longer imported, drop from KNOWN: {sorted(KNOWN - current)}"


def test_the_scan_sees_relative_and_function_level_imports(tmp_path):
    """The scanner resolves relative imports, names the submodule ``from pkg import sub`` takes, and finds imports
    inside functions (a scan that missed them would pass vacuously)."""
    for folder in ("eval", "recipes"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "recipes" / "serve.py").write_text("")
    (tmp_path / "eval" / "client.py").write_text("")
    (tmp_path / "eval" / "orchestrator.py").write_text(
        "from . import client\n"
        "from ..recipes import serve\n"
        "def run():\n"
        "    from ..recipes.serve import export_dir\n"
        "    import longboat.recipes\n")
    found = sorted(imports(tmp_path / "eval" / "orchestrator.py", root=tmp_path))
    assert found == [(1, "longboat.eval.client"), (2, "longboat.recipes.serve"), (4, "longboat.recipes.serve"),
                     (5, "longboat.recipes")]
    nested = {name for _, name in imports(SRC / "models" / "llm" / "__init__.py")}
    assert "longboat.models.llm.parallel_plan" in nested  # imported inside _tensor_parallel_plan
