"""A stand-in policy for testing clients and measuring the server: an untrained MLP with fixed-seed weights.

Its actions mean nothing; they are a deterministic function of the observation and the request's seed (the MLP
over per-channel image means and the state, plus noise drawn from the seed), so batched and unbatched answers can
be compared.
``delay_ms`` adds a fixed time per forward pass, standing in for a heavier model.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import yaml
from pydantic import Field
from torch import nn

from longboat.config.base import ConfigError, StrictModel, validate, yaml_problem
from longboat.serving.served import RequestError, check_keys, checked_array, image_tensor, prompt_of, vector_tensor
from longboat.utils.json_files import JSONTextError, loads

LIBERO_LIKE = {"observation/image": [224, 224, 3], "observation/wrist_image": [224, 224, 3], "observation/state": [8]}


class RandomPolicyConfig(StrictModel):
    observation: dict[str, list[int]] = Field(
        default_factory=lambda: dict(LIBERO_LIKE),
        description="wire key -> shape: [H, W, C] for an image (uint8 or float), [D] for a vector")
    horizon: int = Field(default=10, gt=0)
    action_dim: int = Field(default=7, gt=0)
    hidden: int = Field(default=256, gt=0)
    noise: float = Field(default=0.1, ge=0, description="scale of the seeded noise added to the actions")
    delay_ms: float = Field(default=0.0, ge=0, description="extra time per forward pass")
    seed: int = Field(default=0, description="the weights' seed")


def load_random_policy_config(spec: str) -> RandomPolicyConfig:
    """``spec``: a YAML/JSON file or an inline JSON object (``{}`` for the defaults)."""
    source = spec
    if not spec.lstrip().startswith("{"):
        path = Path(spec)
        try:
            is_file = path.is_file()
        except OSError:  # e.g. a name longer than the file system allows
            is_file = False
        if not is_file:
            raise ConfigError(f"--random-policy: {spec} is neither a file nor an inline JSON object")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{spec}: not valid YAML ({yaml_problem(e)})") from None
    else:
        source = "--random-policy"
        try:
            data = loads(spec)
        except JSONTextError as e:
            raise ConfigError(f"--random-policy: {e.reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of RandomPolicyConfig fields")
    cfg = validate(RandomPolicyConfig, data, source)
    for key, shape in cfg.observation.items():
        if len(shape) not in (1, 3) or min(shape) <= 0:
            raise ConfigError(f"{source}: 'observation.{key}': expected [H, W, C] or [D], got {shape}")
    return cfg


class RandomPolicy:
    """An untrained MLP served through the ``ServedPolicy`` interface."""

    def __init__(self, cfg: RandomPolicyConfig, device: str | torch.device = "cpu"):
        self.cfg, self.device = cfg, torch.device(device)
        self.images = {k: s for k, s in cfg.observation.items() if len(s) == 3}
        self.vectors = {k: s for k, s in cfg.observation.items() if len(s) == 1}
        width = sum(s[-1] for s in self.images.values()) + sum(s[0] for s in self.vectors.values())
        with torch.random.fork_rng(devices=[]):  # seeded weights, leaving the caller's generator alone
            torch.manual_seed(cfg.seed)
            self.net = nn.Sequential(nn.Linear(width, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.hidden),
                                     nn.GELU(), nn.Linear(cfg.hidden, cfg.horizon * cfg.action_dim))
        self.net.to(self.device).eval()
        self.metadata = {"policy": "random", "horizon": cfg.horizon, "action_dim": cfg.action_dim,
                         "observation_keys": list(cfg.observation),
                         "observation_shapes": {k: list(v) for k, v in cfg.observation.items()},
                         "note": "an untrained MLP with fixed-seed weights: its actions mean nothing"}

    def check(self, obs: dict) -> None:
        check_keys(obs, self.cfg.observation)
        for key, shape in self.cfg.observation.items():
            x = checked_array(obs, key, "uf" if len(shape) == 3 else "buif")
            if list(x.shape) != shape and not (len(shape) == 3 and list(x.shape) == [shape[2], *shape[:2]]):
                raise RequestError(f"'{key}': expected shape {shape}, got {list(x.shape)}")
        prompt_of(obs)

    def _features(self, obs: dict) -> torch.Tensor:
        parts = []
        for key, (_, _, c) in self.images.items():
            parts.append(image_tensor(obs, key, c).mean(dim=(-2, -1)))
        for key, (d,) in self.vectors.items():
            parts.append(vector_tensor(obs, key, d).reshape(d))
        return torch.cat(parts)

    @torch.no_grad()
    def infer(self, observations: list[dict], seeds: list[int]) -> list[dict]:
        x = torch.stack([self._features(o) for o in observations]).to(self.device)
        shape = (self.cfg.horizon, self.cfg.action_dim)
        noise = torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(s)) for s in seeds])
        actions = self.net(x).reshape(len(observations), *shape) + self.cfg.noise * noise.to(self.device)
        if self.cfg.delay_ms:
            time.sleep(self.cfg.delay_ms / 1000)
        return [{"actions": a} for a in actions.cpu().numpy()]


def random_policy(spec: str, device: str | torch.device = "cpu") -> RandomPolicy:
    """The random stand-in ``--random-policy`` names (a YAML/JSON file or an inline JSON object) on ``device``."""
    return RandomPolicy(load_random_policy_config(spec), device)
