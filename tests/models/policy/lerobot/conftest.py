"""The LeRobot policy fixtures with their weights rebuilt (``model.safetensors`` is not committed), once a session."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
sys.path.insert(0, str(FIXTURES))

from lerobot_policy_weights import observation, write_weights  # noqa: E402

TYPES = ("act", "act_prenorm")


@pytest.fixture(scope="session")
def lerobot_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lerobot_policies")
    out = {}
    for name in TYPES:
        target = root / name
        shutil.copytree(FIXTURES / "lerobot_policies" / name, target)
        write_weights(target)
        out[name] = target
    return out


def reference(directory: Path) -> tuple[list[dict[str, torch.Tensor]], list[torch.Tensor]]:
    """The fixture's observations (batch and time axes added) and LeRobot's chunks for them."""
    ref = json.loads((directory / "reference.json").read_text())
    observations = [{k: torch.from_numpy(v)[None, None] for k, v in observation(seed, ref["observation_shapes"]).items()}
                    for seed in ref["seeds"]]
    return observations, [torch.tensor(c) for c in ref["chunks"]]
