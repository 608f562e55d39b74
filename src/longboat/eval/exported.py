"""A trained policy served from its export: wire observations in robot units to action chunks in robot units.

Per batch: each request's wire keys become dataset features (the export's ``wire_keys``), images become float
[C, H, W] in [0, 1] as the dataset hands them to the transforms, every feature gets its time axis, the requests
are stacked, the exported transform pipeline is applied (normalise, resize, pad), ``predict`` draws from each
request's seed, and the pipeline's inverse maps the chunk back to robot units: ``actions`` [horizon, A] each.
"""

from __future__ import annotations

from typing import Callable

import torch

from longboat.data.robot.transforms import Pipeline
from longboat.eval.served import RequestError, array_of, check_keys, image_tensor, prompt_of, vector_tensor
from longboat.models.policy.base import Policy

PromptEncoder = Callable[[list[str]], tuple[torch.Tensor, torch.Tensor]]  # prompts -> (tokens, mask) [B, L]


class ExportedPolicy:
    def __init__(self, model: Policy, pipeline: Pipeline, wire_keys: dict[str, str],
                 shapes: dict[str, list[int]] | None = None, device: str | torch.device = "cpu",
                 prompts: PromptEncoder | None = None, metadata: dict | None = None):
        """``wire_keys``: wire observation key -> dataset feature; ``shapes``: dataset feature -> its shape in
        the dataset ([H, W, C] for cameras), checked against each request when given."""
        self.model, self.pipeline = model.to(device).eval(), pipeline.eval()
        self.cfg, self.device, self.prompts = model.cfg, torch.device(device), prompts
        self.wire_keys, self.shapes = dict(wire_keys), dict(shapes or {})
        self.images = {w for w, f in self.wire_keys.items() if f in self.cfg.image_features}
        self.metadata = {"horizon": self.cfg.horizon, "action_dim": self.cfg.action_dim,
                         "n_obs_steps": self.cfg.n_obs_steps, "observation_keys": list(self.wire_keys),
                         **(metadata or {})}

    def _time_axis(self, key: str, ndim: int, base: int, shape: list[int]) -> None:
        n = self.cfg.n_obs_steps
        if ndim != base + (n > 1) or (n > 1 and shape[0] != n):
            want = "[" + (f"{n}, " if n > 1 else "") + ("H, W, C" if base == 3 else "D") + "]"
            raise RequestError(f"'{key}': expected {want}" + (f" (the last {n} frames, oldest first)" if n > 1 else "")
                               + f", got shape {shape}")

    def check(self, obs: dict) -> None:
        check_keys(obs, self.wire_keys)
        for key, feature in self.wire_keys.items():
            x = array_of(obs, key, "uf" if key in self.images else "buif")
            base = 3 if key in self.images else 1
            self._time_axis(key, x.ndim, base, list(x.shape))
            frame, want = list(x.shape[-base:]), self.shapes.get(feature)
            if want is not None and frame != want and not (base == 3 and frame == [want[2], *want[:2]]):
                raise RequestError(f"'{key}': expected frames of shape {want}, got {frame}")
        prompt_of(obs)

    def _features(self, obs: dict) -> dict[str, torch.Tensor]:
        out = {}
        for key, feature in self.wire_keys.items():
            x = image_tensor(obs, key) if key in self.images else vector_tensor(obs, key)
            out[feature] = x if self.cfg.n_obs_steps > 1 else x.unsqueeze(0)
        return out

    @torch.no_grad()
    def infer(self, observations: list[dict], seeds: list[int]) -> list[dict]:
        items = [self._features(o) for o in observations]
        batch = {f: torch.stack([item[f] for item in items]).to(self.device) for f in items[0]}
        obs = self.pipeline.apply(batch)
        tasks = [prompt_of(o) for o in observations]
        inputs = {**obs, "task": tasks}
        if self.prompts is not None:
            tokens, mask = self.prompts(tasks)
            inputs["prompt_tokens"], inputs["prompt_mask"] = tokens.to(self.device), mask.to(self.device)
        keys = torch.tensor(seeds, dtype=torch.int64, device=self.device)
        chunk = self.model.predict(inputs, noise_key=keys)
        actions = self.pipeline.unapply({**obs, self.cfg.action_feature: chunk})[self.cfg.action_feature]
        return [{"actions": a} for a in actions.float().cpu().numpy()]
