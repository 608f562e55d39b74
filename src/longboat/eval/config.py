"""``longboat eval`` configuration: what to evaluate, on which tasks and seeds, with how many envs, into where."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from longboat.config.base import ConfigError, StrictModel, load_yaml, validate

MAX_EPISODE_SEED = 1 << 32  # keeps request seeds (episode seed * 1_000_003 + step) well within the protocol's 2**63


class ObservationConfig(StrictModel):
    """What the envs render for the policy. Read from the export's ``policy.json`` when the policy is an export;
    needed when it is a URL."""

    cameras: list[str] = Field(default_factory=list, description="simulator cameras (observation.images.<name>)")
    image_size: int = Field(default=128, ge=8)
    state_dim: int | None = Field(default=None, gt=0, description="zero-pad the state to this; null: as given")
    wire_keys: dict[str, str] | None = Field(default=None, description="wire key -> feature; null: feature names")


class ServeConfig(StrictModel):
    """How the policy server is started when ``policy`` is an export or a run directory."""

    device: str | None = None
    batch_window_ms: float = Field(default=2.0, ge=0)
    max_batch: int = Field(default=32, gt=0)
    deterministic: bool = Field(default=False, description="each request in a forward pass of its own: an "
                                "evaluation run twice gives the same episodes, whatever requests meet in a batch")
    threads: int | None = Field(default=None, gt=0)
    startup_timeout_s: float = Field(default=120.0, gt=0)
    plugins: list[str] = Field(default_factory=list, description="modules or .py files the server imports to "
                               "register the policy's architecture (an export's own list is never imported)")
    verbose: bool = Field(default=False, description="server.log also gets each connection opened and closed and "
                          "each health check")
    host: str = Field(default="127.0.0.1", description="where the server listens: on a Ray cluster of several "
                      "machines, an address the workers reach (0.0.0.0: all interfaces)")


class RayConfig(StrictModel):
    """Where ``backend: ray`` runs the episodes and how. Each runner (a Ray actor) runs batches of one task's
    episodes on ``num_envs`` envs and policy clients of its own. The workers must reach the policy server: one the
    evaluation starts listens on ``serve.host``."""

    address: str | None = Field(default=None, description="auto, ray://host:10001 or host:port; null: start a "
                                "local Ray instance (or use the one this process already started)")
    runners: int | None = Field(default=None, gt=0, description="runners at once; null: as many as the "
                                "cluster's CPUs hold")
    cpus_per_runner: float = Field(default=1.0, gt=0, description="CPUs each runner reserves (async envs run a "
                                   "process each: num_envs)")
    episodes_per_runner: int = Field(default=10, gt=0, description="episodes a runner is given at a time: its envs "
                                     "are built once for them")
    max_retries: int = Field(default=2, ge=0, description="times a batch whose runner died is run again for its "
                             "episodes not yet written")


class EvalConfig(StrictModel):
    plugins: list[str] = Field(default_factory=list, description="modules or .py files (relative to the config) "
                               "imported first, to register a benchmark's runner or simulator")
    benchmark: str = Field(description="runner name: metaworld, fetch, pusht, a LIBERO suite (libero_spatial, ...), "
                           "or one a plugin registers")
    tasks: list[str] = Field(min_length=1)
    episodes: int = Field(default=10, gt=0, description="episodes per task (seeds seed, seed+1, ...)")
    seed: int = Field(default=0, ge=0, lt=MAX_EPISODE_SEED)
    seeds: list[Annotated[int, Field(ge=0, lt=MAX_EPISODE_SEED)]] | None = Field(
        default=None, description="explicit episode seeds (overrides episodes/seed)")
    policy: str = Field(description="an export or run directory (served by a managed server), or ws://host:port")
    serve: ServeConfig = Field(default_factory=ServeConfig)
    observation: ObservationConfig | None = None
    num_envs: int = Field(default=4, gt=0, description="envs stepped together (per runner with backend: ray)")
    backend: Literal["local", "ray"] = Field(default="local", description="local: the episodes run in this process; "
                                             "ray: in Ray actors on the cluster at ray.address")
    ray: RayConfig = Field(default_factory=RayConfig)
    vector: Literal["auto", "sync", "async"] = Field(
        default="auto", description="auto: async (spawned workers) when envs render cameras, else sync")
    replan_steps: int | None = Field(default=None, gt=0, description="actions used per chunk; null: the policy's "
                                     "own (LeRobot's n_action_steps), else the horizon")
    temporal_ensemble: float | bool | None = Field(
        default=None, description="ACT's temporal ensembling: a coefficient (every chunk covering a step votes, "
        "weighted exp(-coefficient * i), i = 0 the oldest; the policy is asked every step); false: off; null: the "
        "policy's own (its metadata's temporal_ensemble_coeff)")
    max_steps: int | None = Field(default=None, gt=0, description="episode step limit; null: the benchmark's")
    episode_timeout_s: float | None = Field(default=None, gt=0, description="wall-clock limit per episode")
    request_timeout_s: float = Field(default=60.0, gt=0)
    videos_per_task: int = Field(default=2, ge=0)
    video_camera: str | None = Field(default=None, description="null: the first policy camera, else the default")
    video_size: int = Field(default=128, ge=16)
    output_dir: str

    @field_validator("temporal_ensemble", mode="before")
    @classmethod
    def _coefficient(cls, value):
        if value is True:
            raise ValueError("expected a coefficient, false (off) or null (the policy's own), got true")
        if value is False or value is None:
            return value
        if isinstance(value, (int, float)) and not math.isfinite(value):
            raise ValueError(f"expected a finite coefficient, got {value}")
        return float(value) if isinstance(value, int) else value

    @model_validator(mode="after")
    def _distinct(self):
        if self.temporal_ensemble not in (None, False) and (self.replan_steps or 1) > 1:
            raise ValueError(f"temporal_ensemble asks the policy every step: replan_steps must be 1 or null, got "
                             f"{self.replan_steps}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks name a task twice: {self.tasks}")
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds name a seed twice: {self.seeds}")
        if self.seeds is None and self.seed + self.episodes > MAX_EPISODE_SEED:
            raise ValueError(f"seed + episodes must stay below 2**32, got {self.seed} + {self.episodes}")
        return self

    @property
    def is_url(self) -> bool:
        return self.policy.startswith(("ws://", "wss://"))

    def episode_seeds(self) -> list[int]:
        return list(self.seeds) if self.seeds is not None else [self.seed + i for i in range(self.episodes)]

    def identity(self) -> dict:
        """What decides which episodes a run holds and what they mean: a resumed run must agree on it."""
        return {"benchmark": self.benchmark, "policy": self.policy, "seeds": self.episode_seeds(),
                "replan_steps": self.replan_steps,
                "temporal_ensemble": self.temporal_ensemble, "max_steps": self.max_steps,
                "observation": self.observation.model_dump() if self.observation else None}


def load_eval_config(path: str | Path, overrides: list[str] | None = None) -> EvalConfig:
    from longboat.config.base import apply_overrides
    from longboat.utils.plugins import load_plugins

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such eval config")
    data = apply_overrides(load_yaml(path), overrides or [])
    plugins = data.get("plugins") or []
    # Imported before anything is resolved (as a run config's are), named by absolute path from here on.
    data = {**data, "plugins": load_plugins(plugins if isinstance(plugins, list) else [plugins], path.parent)}
    return validate(EvalConfig, data, str(path))
