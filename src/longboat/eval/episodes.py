"""One task's episodes on a vector env against a policy server: the stepping loop both backends run (the local one
in the orchestrator's process, the Ray one in each runner actor).

``num_envs`` environments step together (gymnasium vector envs); the envs that need a new action chunk ask the
server at the same time (one client each, so the server batches them) and each uses ``replan_steps`` actions of its
chunk. An episode ends at its first success, at the step limit (``time_limit``) or at the wall-clock limit
(``wall_time``). The request seed is a function of the episode seed and the step, so an episode replays the same
however the envs are laid out and whether the server restarted under it.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from longboat.errors import LongboatError
from longboat.eval.client import PolicyClient
from longboat.eval.config import EvalConfig
from longboat.eval.runners import Runner
from longboat.eval.runners.base import FRAME_INFO

_SEED_STRIDE = 1_000_003  # request seed = episode seed * stride + step


class EvalError(LongboatError, RuntimeError):
    """The evaluation cannot go on (the policy refused a request, the output dir holds another run)."""


@dataclass
class Timing:
    """Where the wall time of the episodes went: stepping the envs (rendering included) and waiting for chunks."""

    env_s: float = 0.0
    request_s: float = 0.0
    steps: int = 0

    def add(self, other: Timing) -> None:
        self.env_s += other.env_s
        self.request_s += other.request_s
        self.steps += other.steps


@dataclass
class FinishedEpisode:
    """A results line (its ``video`` still None) and, for an episode recorded on video, its frames: the process
    that owns the output dir writes both."""

    result: dict
    frames: list
    fps: int


@dataclass
class _Episode:
    task: str
    seed: int
    prompt: str
    video: bool
    started: float = field(default_factory=time.monotonic)
    step: int = 0
    reward: float = 0.0
    history: deque = field(default_factory=deque)
    chunk: np.ndarray | None = None
    chunk_start: int = 0
    latency_ms: list = field(default_factory=list)
    infer_ms: list = field(default_factory=list)
    frames: list = field(default_factory=list)


def policy_client(cfg: EvalConfig, url: str) -> PolicyClient:
    """A client that waits for a server still starting (or restarting) and gives up on a request after the
    config's timeout."""
    return PolicyClient(url, timeout_s=cfg.request_timeout_s, connect_timeout_s=cfg.serve.startup_timeout_s + 30)


def vector_mode(cfg: EvalConfig, runner: Runner, num_envs: int) -> str:
    """``cfg.vector``; for ``auto``, async (a process per env) when the envs render cameras and there are several."""
    return cfg.vector if cfg.vector != "auto" else ("async" if runner.renders() and num_envs > 1 else "sync")


def _request(client: PolicyClient, obs: dict, seed: int) -> tuple[np.ndarray, float, float]:
    start = time.perf_counter()
    reply = client.infer(obs, seed=seed)
    latency = (time.perf_counter() - start) * 1000
    return np.asarray(reply["actions"]), latency, float(reply.get("policy_timing", {}).get("infer_ms", 0.0))


def run_episodes(cfg: EvalConfig, runner: Runner, task: str, seeds: list[int], video_seeds: set[int],
                 clients: list[PolicyClient], pool: Executor, replan: int, n_obs: int,
                 timing: Timing) -> Iterator[FinishedEpisode]:
    """Run the episodes of ``task`` with ``seeds`` on ``min(num_envs, len(seeds))`` envs, one client and one pool
    thread each; yields each episode as it finishes."""
    n = min(cfg.num_envs, len(seeds))
    vec = runner.make_vector_env(task, n, vector_mode(cfg, runner, n))
    try:
        prompt = vec.get_attr("prompt")[0]
        limit = min(cfg.max_steps or 10**9, *vec.get_attr("max_steps"))
        fps = vec.get_attr("fps")[0]
        space = vec.single_action_space
        queue, slots = deque(seeds), [None] * n

        def start(mask: np.ndarray, obs=None) -> dict:
            """Reset the masked envs into their next episodes (an env with none left idles on a fresh reset)."""
            reset_seeds = []
            for i in np.flatnonzero(mask):
                slots[i] = _Episode(task, queue.popleft(), prompt, False) if queue else None
                reset_seeds.append(slots[i].seed if slots[i] else 0)
            full = [None] * n
            for i, s in zip(np.flatnonzero(mask), reset_seeds):
                full[i] = int(s)
            new_obs, info = vec.reset(seed=full, options={"reset_mask": mask, "video_seeds": sorted(video_seeds)})
            for i in np.flatnonzero(mask):
                ep = slots[i]
                if ep is not None:
                    ep.video = ep.seed in video_seeds
                    _remember(ep, {k: v[i] for k, v in new_obs.items()}, n_obs)
                    if ep.video and info.get("_" + FRAME_INFO, np.zeros(n, bool))[i]:
                        ep.frames.append(info[FRAME_INFO][i])
            return new_obs

        start(np.ones(n, bool))
        while any(slots):
            asks = {i: ep for i, ep in enumerate(slots)
                    if ep is not None and (ep.chunk is None or ep.step - ep.chunk_start >= replan)}
            futures = {i: pool.submit(_request, clients[i], runner.request(_stacked(ep.history), ep.prompt),
                                      (ep.seed * _SEED_STRIDE + ep.step) % (1 << 63)) for i, ep in asks.items()}
            waited = time.perf_counter()
            for i, f in futures.items():
                ep = slots[i]
                try:
                    ep.chunk, latency, infer = f.result()
                except LongboatError as e:
                    raise EvalError(f"{task} seed {ep.seed}: {e}") from None
                ep.chunk_start = ep.step
                ep.latency_ms.append(round(latency, 3))
                ep.infer_ms.append(round(infer, 3))
            timing.request_s += time.perf_counter() - waited
            actions = np.zeros((n, *space.shape), np.float32)
            for i, ep in enumerate(slots):
                if ep is not None:
                    actions[i] = runner.action(ep.chunk[ep.step - ep.chunk_start], space)
            stepped = time.perf_counter()
            obs, reward, success, _, info = vec.step(actions)
            timing.env_s += time.perf_counter() - stepped
            timing.steps += 1
            finished = np.zeros(n, bool)
            for i, ep in enumerate(slots):
                if ep is None:
                    continue
                ep.step += 1
                ep.reward += float(reward[i])
                _remember(ep, {k: v[i] for k, v in obs.items()}, n_obs)
                if ep.video and info.get("_" + FRAME_INFO, np.zeros(n, bool))[i]:
                    ep.frames.append(info[FRAME_INFO][i])
                wall = cfg.episode_timeout_s is not None and time.monotonic() - ep.started > cfg.episode_timeout_s
                if success[i] or ep.step >= limit or wall:
                    failure = None if success[i] else ("time_limit" if ep.step >= limit else "wall_time")
                    yield _finish(ep, bool(success[i]), failure, fps)
                    finished[i] = True
            if finished.any():
                start(finished)
    finally:
        vec.close()


def _remember(ep: _Episode, obs: dict, n_obs: int) -> None:
    """Keep the last ``n_obs`` observations; the first is repeated before the episode's start."""
    if not ep.history:
        ep.history.extend([obs] * n_obs)
    ep.history.append(obs)
    while len(ep.history) > n_obs:
        ep.history.popleft()


def _stacked(history: deque) -> dict:
    if len(history) == 1:
        return history[0]
    return {k: np.stack([h[k] for h in history]) for k in history[0]}


def _finish(ep: _Episode, success: bool, failure: str | None, fps: int) -> FinishedEpisode:
    result = {"task": ep.task, "seed": ep.seed, "success": success, "reward": round(ep.reward, 6),
              "length": ep.step, "failure": failure, "latency_ms": ep.latency_ms, "infer_ms": ep.infer_ms,
              "wall_s": round(time.monotonic() - ep.started, 3), "video": None}
    return FinishedEpisode(result, ep.frames, fps)
