"""``longboat serve``: a policy export (or a run directory's export, or a LeRobot policy directory) behind the openpi
websocket protocol.

What is served is always an export (safetensors, JSON, the transform pipeline's files): a checkpoint must be
exported first, so the server never reads a pickle. Nor does it import the plugins an export lists: its
architecture comes registered (``--plugin``, an installed package), or from a run directory's own config. The
recipe opens it (``open_artifact``) and hands it to ``serving``, which adapts, checks and serves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from longboat.checkpoint.export import find_export

if TYPE_CHECKING:
    from longboat.serving.served_export import ServedExport


def open_served_policy(path: str | Path, device: str | torch.device = "cpu") -> ServedExport:
    """The export ``path`` names (itself, a run directory's ``export/`` or a LeRobot policy directory; never a
    checkpoint) ready to serve."""
    # Imported here: the model registry takes seconds to import, which a --random-policy server does without.
    from longboat.models.policy import is_lerobot_dir
    from longboat.recipes.artifact import open_artifact
    from longboat.serving.policy_bundle import open_policy
    from longboat.serving.served_export import served_export

    if not is_lerobot_dir(path):  # a LeRobot policy directory is served as it is: safetensors and JSON too
        find_export(path)
    return served_export(open_policy(open_artifact(path)), device)  # a run directory's with its own plugins
