"""``ServedExport`` adapts a ``PolicyBundle`` (an export's policy) to the policy server.

Per batch: each request's wire keys become dataset features (``policy.json``'s ``wire_keys``), images become float
[C, H, W] in [0, 1] as the dataset hands them to the transforms, every feature gets its time axis, the requests are
stacked, and ``PolicyBundle.act`` applies the transforms, predicts with each request's seed as its noise key, and
maps the chunk back to robot units.
"""

from __future__ import annotations

import torch

from longboat.config.base import ConfigError
from longboat.serving.policy_bundle import PolicyBundle
from longboat.serving.served import RequestError, check_keys, checked_array, image_tensor, prompt_of, vector_tensor


class ServedExport:
    def __init__(self, bundle: PolicyBundle, device: str | torch.device = "cpu"):
        self.bundle, self.cfg, self.device = bundle, bundle.config, torch.device(device)
        bundle.policy.to(self.device)
        self.wire_keys = bundle.wire_keys
        inputs = bundle.spec.get("input_features") or {}
        self.shapes = {f: list(inputs[f]["shape"]) for f in self.wire_keys.values() if "shape" in inputs.get(f, {})}
        self.images = {w for w, f in self.wire_keys.items() if f in self.cfg.image_features}
        spec = bundle.spec
        shapes = {w: self.shapes[f] for w, f in self.wire_keys.items() if f in self.shapes}
        self.metadata = {"policy": type(bundle.policy).__name__, "horizon": self.cfg.horizon,
                         "action_dim": self.cfg.action_dim, "n_obs_steps": self.cfg.n_obs_steps,
                         "observation_keys": list(self.wire_keys), "observation_shapes": shapes, "fps": spec.get("fps"),
                         "robot_type": spec.get("robot_type"), "tasks": spec.get("tasks", [])}
        for key in ("n_action_steps", "temporal_ensemble_coeff"):  # how the policy's own code executes its chunks
            if spec.get(key) is not None:
                self.metadata[key] = spec[key]

    def _time_axis(self, key: str, base: int, shape: list[int]) -> None:
        n = self.cfg.n_obs_steps
        if len(shape) != base + (n > 1) or (n > 1 and shape[0] != n):
            want = "[" + (f"{n}, " if n > 1 else "") + ("H, W, C" if base == 3 else "D") + "]"
            raise RequestError(f"'{key}': expected {want}" + (f" (the last {n} frames, oldest first)" if n > 1 else "")
                               + f", got shape {shape}")

    def check(self, obs: dict) -> None:
        check_keys(obs, self.wire_keys)
        for key, feature in self.wire_keys.items():
            base = 3 if key in self.images else 1
            x = checked_array(obs, key, "uf" if base == 3 else "buif")
            self._time_axis(key, base, list(x.shape))
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

    def infer(self, observations: list[dict], seeds: list[int]) -> list[dict]:
        items = [self._features(o) for o in observations]
        batch = {f: torch.stack([item[f] for item in items]).to(self.device) for f in items[0]}
        batch["task"] = [prompt_of(o) for o in observations]
        keys = torch.tensor(seeds, dtype=torch.int64, device=self.device)
        actions = self.bundle.act(batch, noise_key=keys)
        return [{"actions": a} for a in actions.float().cpu().numpy()]


def served_export(bundle: PolicyBundle, device: str | torch.device = "cpu") -> ServedExport:
    """``bundle`` ready to serve on ``device``: its wire keys checked against the features it reads, and (off the
    CPU) its size against the device's memory."""
    # Imported here: the model registry takes seconds to import, which a --random-policy server does without.
    from longboat.models.footprint import check_fits, measure

    directory = bundle.source
    observed = {*bundle.config.image_features, bundle.config.state_feature} - {None}
    unknown = [f for f in bundle.wire_keys.values() if f not in observed]
    unmapped = observed - {*bundle.wire_keys.values()}
    if unknown or unmapped:
        raise ConfigError(f"{directory}/policy.json: 'wire_keys' must map one wire key to each feature the policy "
                          f"reads ({sorted(observed)}); unknown: {unknown}, unmapped: {sorted(unmapped)}")
    if torch.device(device).type != "cpu":  # built on the CPU, checked there; the device may hold less
        check_fits(measure(bundle.policy), directory, device)
    return ServedExport(bundle, device)
