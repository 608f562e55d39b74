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

from lerobot_policy_weights import noise, observation, write_weights  # noqa: E402

TYPES = ("act", "act_prenorm", "diffusion", "diffusion_ddpm", "diffusion_crop")


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
    time_axis = json.loads((directory / "config.json").read_text())["n_obs_steps"] == 1
    observations = [{k: torch.from_numpy(v)[None, None] if time_axis else torch.from_numpy(v)[None]
                     for k, v in observation(seed, ref["observation_shapes"]).items()} for seed in ref["seeds"]]
    return observations, [torch.tensor(c) for c in ref["chunks"]]


def seeds(directory: Path) -> list[int]:
    return json.loads((directory / "reference.json").read_text())["seeds"]


def lerobot_noise(seed: int, shape: list[int]):
    """The noise the fixture gave LeRobot's diffusion sampler: the initial draw, and a per-step draw function
    repeating the torch generator LeRobot's scheduler drew from."""
    generator = torch.Generator().manual_seed(seed)
    return torch.from_numpy(noise(seed, shape)), lambda i: torch.randn(shape, generator=generator)
