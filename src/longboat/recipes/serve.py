"""``longboat serve``: a policy export (or a run directory's export) behind the openpi websocket protocol.

What is served is always an export (safetensors, JSON, the transform pipeline's files): a checkpoint must be
exported first, so the server never reads a pickle.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from longboat.checkpoint.export import EXPORT_CONFIG
from longboat.config.base import ConfigError
from longboat.eval.random_policy import RandomPolicy, load_random_policy_config
from longboat.eval.served import ServedPolicy
from longboat.eval.server import PolicyServer, ServerConfig

POLICY_MANIFEST = "policy.json"


def export_dir(path: str | Path) -> Path:
    """The export that ``path`` names: itself, or a run directory's ``export/``."""
    path = Path(path)
    for candidate in (path, path / "export"):
        if (candidate / EXPORT_CONFIG).is_file():
            return candidate
    raise ConfigError(f"{path}: not a policy export nor a run directory with one; a checkpoint is served after "
                      f"`longboat export RUN_DIR --output DIR`")


def read_manifest(directory: Path) -> tuple[dict[str, str], dict[str, list[int]]]:
    """(wire key -> dataset feature, dataset feature -> shape) from the export's ``policy.json``."""
    path = directory / POLICY_MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{directory}: no {POLICY_MANIFEST}; is this the export of a policy?") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    wire_keys = manifest.get("wire_keys") if isinstance(manifest, dict) else None
    if not isinstance(wire_keys, dict) or not wire_keys or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in wire_keys.items()):
        raise ConfigError(f"{path}: 'wire_keys' must map wire observation keys to dataset features")
    shapes = {}
    for feature, info in (manifest.get("features") or {}).items():
        if isinstance(info, dict) and isinstance(info.get("shape"), list):
            shapes[feature] = [int(s) for s in info["shape"]]
    return wire_keys, shapes


def open_served_policy(path: str | Path, device: str | torch.device = "cpu") -> ServedPolicy:
    # Imported here: the model registry takes seconds to import, which a --random-policy server does without.
    from longboat.data.robot.transforms import load_pipeline
    from longboat.eval.exported import ExportedPolicy
    from longboat.models.policy.base import Policy
    from longboat.recipes.artifact import open_artifact

    directory = export_dir(path)
    artifact = open_artifact(directory)
    if not isinstance(artifact.model, Policy):
        raise ConfigError(f"{directory}: '{artifact.arch}' is not a policy; `longboat serve` serves robot policies")
    wire_keys, shapes = read_manifest(directory)
    observed = {*artifact.config.image_features, artifact.config.state_feature} - {None}
    unknown, unmapped = [f for f in wire_keys.values() if f not in observed], observed - {*wire_keys.values()}
    if unknown or unmapped:
        raise ConfigError(f"{directory / POLICY_MANIFEST}: 'wire_keys' must map one wire key to each feature the "
                          f"policy reads ({sorted(observed)}); unknown: {unknown}, unmapped: {sorted(unmapped)}")
    pipeline = load_pipeline(directory)
    return ExportedPolicy(artifact.model, pipeline, wire_keys, shapes, device,
                          metadata={"policy": artifact.arch, "export": str(directory)})


def random_policy(spec: str, device: str | torch.device = "cpu") -> RandomPolicy:
    return RandomPolicy(load_random_policy_config(spec), device)


def set_cpu_threads(threads: int | None) -> int:
    """Torch's CPU threads for the policy: ``threads``, else all that torch would use but one, which is left to
    the event loop (intra-op threads spinning on its core slow every request, by tens of times when cores are
    scarce)."""
    n = threads if threads is not None else max(1, torch.get_num_threads() - 1)
    torch.set_num_threads(n)
    return n


def serve(policy: ServedPolicy, cfg: ServerConfig) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM, logging to stderr."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    PolicyServer(policy, cfg).run()
