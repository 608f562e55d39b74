"""``longboat serve``: a policy export (or a run directory's export) behind the openpi websocket protocol.

What is served is always an export (safetensors, JSON, the transform pipeline's files): a checkpoint must be
exported first, so the server never reads a pickle. Nor does it import the plugins an export lists: its
architecture comes registered (``--plugin``, an installed package), or from a run directory's own config.

``ServedExport`` adapts a ``PolicyBundle`` to the server. Per batch: each request's wire keys become dataset
features (``policy.json``'s ``wire_keys``), images become float [C, H, W] in [0, 1] as the dataset hands them to
the transforms, every feature gets its time axis, the requests are stacked, and ``PolicyBundle.act`` applies the
transforms, predicts with each request's seed as its noise key, and maps the chunk back to robot units.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from longboat.checkpoint.export import find_export
from longboat.config.base import ConfigError
from longboat.eval.random_policy import RandomPolicy, load_random_policy_config
from longboat.eval.served import (
    RequestError, ServedPolicy, check_keys, checked_array, image_tensor, prompt_of, vector_tensor,
)
from longboat.eval.server import PolicyServer, ServerConfig

if TYPE_CHECKING:
    from longboat.recipes.policy_bundle import PolicyBundle


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


def open_served_policy(path: str | Path, device: str | torch.device = "cpu") -> ServedExport:
    # Imported here: the model registry takes seconds to import, which a --random-policy server does without.
    from longboat.models.footprint import check_fits, measure
    from longboat.recipes.policy_bundle import open_policy

    directory = find_export(path)
    bundle = open_policy(path)  # a run directory's export, with the plugins of the run's own config
    observed = {*bundle.config.image_features, bundle.config.state_feature} - {None}
    unknown = [f for f in bundle.wire_keys.values() if f not in observed]
    unmapped = observed - {*bundle.wire_keys.values()}
    if unknown or unmapped:
        raise ConfigError(f"{directory}/policy.json: 'wire_keys' must map one wire key to each feature the policy "
                          f"reads ({sorted(observed)}); unknown: {unknown}, unmapped: {sorted(unmapped)}")
    if torch.device(device).type != "cpu":  # built on the CPU, checked there; the device may hold less
        check_fits(measure(bundle.policy), directory, device)
    return ServedExport(bundle, device)


def random_policy(spec: str, device: str | torch.device = "cpu") -> RandomPolicy:
    return RandomPolicy(load_random_policy_config(spec), device)


def resolve_device(name: str | None) -> torch.device:
    """``--device`` as a torch device this machine has (default: cuda when available, else cpu); a name torch does
    not know or a device that is not here is refused before the policy is loaded."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ConfigError(f"--device {name}: not a device to serve on (expected cpu, cuda, cuda:N or mps)")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"--device {name}: this machine has no CUDA device; use --device cpu")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"--device {name}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as e:  # torch says "not compiled with" by an AssertionError
        why = str(e).splitlines()[0].split(". ")[0]
        raise ConfigError(f"--device {name}: not usable on this machine ({why})") from None
    return device


def set_cpu_threads(threads: int | None) -> int:
    """Torch's CPU threads for the policy: ``threads``, else all that torch would use but one, which is left to
    the event loop (intra-op threads spinning on its core slow every request, by tens of times when cores are
    scarce)."""
    n = threads if threads is not None else max(1, torch.get_num_threads() - 1)
    torch.set_num_threads(n)
    return n


def serve(policy: ServedPolicy, cfg: ServerConfig, verbose: bool = False, exit_with_stdin: bool = False) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM (or stdin's end, when ``exit_with_stdin``), logging to
    stderr; websockets' own lines (every connection opened and closed, every health check answered) only when
    ``verbose``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("websockets").setLevel(logging.INFO if verbose else logging.WARNING)
    PolicyServer(policy, cfg).run(stop_on_eof=sys.stdin.buffer if exit_with_stdin else None)
