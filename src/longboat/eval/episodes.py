"""One task's episodes on vector envs against a policy server: the stepping loop both backends run (the local one
in the orchestrator's process, the Ray one in each runner actor).

``num_envs`` environments in one process step together (gymnasium's sync vector env); the envs that need a new
action chunk ask the server at the same time (one client each, so the server batches them) and each follows the
run's ``ChunkSchedule``: ``replan_steps`` actions of each chunk, or ACT's temporal ensemble of every chunk covering
the step (asked every step). Environments in processes of their own (async, for rendering envs) run a
loop each, so stepping and inference overlap. An episode ends at its first success, at the step limit
(``time_limit``) or at the wall-clock limit (``wall_time``). The request seed is a function of the episode seed and
the step, so an episode replays the same however the envs are laid out and whether the server restarted under it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass, field
from queue import Queue
from typing import Collection, Iterator

import numpy as np

from longboat.config.base import ConfigError
from longboat.errors import LongboatError
from longboat.eval.config import EvalConfig
from longboat.eval.runners import Runner
from longboat.eval.runners.base import FRAME_INFO
from longboat.serving.client import ActionChunks, PolicyClient

_SEED_STRIDE = 1_000_003  # request seed = episode seed * stride + step


class EvalError(LongboatError, RuntimeError):
    """The evaluation cannot go on (the policy refused a request, the output dir holds another run)."""


@dataclass
class Timing:
    """Where the wall time of the episodes went: stepping the envs (rendering included) and waiting for chunks (for
    lanes running side by side, a lane's on average); ``steps`` counts vector steps over all lanes."""

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
    chunks: ActionChunks | None = None
    latency_ms: list = field(default_factory=list)
    infer_ms: list = field(default_factory=list)
    frames: list = field(default_factory=list)


@dataclass(frozen=True)
class ChunkSchedule:
    """How every episode of a run uses its chunks: ``replan`` actions of each, or (``ensemble`` set) ACT's temporal
    ensemble, asking every step. ``source`` says what set each (config, policy metadata, horizon)."""

    replan: int
    ensemble: float | None = None
    source: tuple[tuple[str, str], ...] = ()

    def chunks(self) -> ActionChunks:
        return ActionChunks(self.replan, self.ensemble)

    def record(self) -> dict:
        """As ``summary.json`` records it."""
        return {"replan_steps": self.replan, "temporal_ensemble": self.ensemble, "set_by": dict(self.source)}


def chunk_schedule(cfg: EvalConfig, meta: dict, horizon: int) -> ChunkSchedule:
    """The config's ``temporal_ensemble`` (a coefficient, or false: off), else the policy's own (its metadata's
    ``temporal_ensemble_coeff``); without ensembling, ``replan_steps`` actions per chunk: the config's, else the
    policy's (``n_action_steps``), else the whole chunk."""
    ensemble, by = cfg.temporal_ensemble, "config"
    if ensemble is None:
        ensemble, by = meta.get("temporal_ensemble_coeff"), "policy metadata"
        if ensemble is not None and (isinstance(ensemble, bool) or not isinstance(ensemble, (int, float))
                                     or not np.isfinite(ensemble)):
            raise EvalError(f"the policy's metadata: temporal_ensemble_coeff {ensemble!r} is not a finite number; "
                            "set temporal_ensemble in the config")
    if ensemble is False or ensemble is None:
        replan, how = ((cfg.replan_steps, "config") if cfg.replan_steps else
                       (int(meta["n_action_steps"]), "policy metadata") if meta.get("n_action_steps") else
                       (horizon, "horizon"))
        return ChunkSchedule(min(replan, horizon), None, (("replan_steps", how),) +
                             ((("temporal_ensemble", "config"),) if ensemble is False else ()))
    if (cfg.replan_steps or 1) > 1:
        raise ConfigError(f"replan_steps: {cfg.replan_steps}, but the policy ensembles its chunks (its metadata's "
                          f"temporal_ensemble_coeff {ensemble}), which asks every step: set temporal_ensemble: false "
                          f"to use {cfg.replan_steps} actions of each chunk")
    return ChunkSchedule(1, float(ensemble), (("replan_steps", "temporal_ensemble"), ("temporal_ensemble", by)))


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


def run_episodes(cfg: EvalConfig, runner: Runner, task: str, seeds: list[int], video_seeds: Collection[int],
                 clients: list[PolicyClient], pool: Executor, schedule: ChunkSchedule, n_obs: int,
                 timing: Timing, interrupt: threading.Event | None = None) -> Iterator[FinishedEpisode]:
    """Run the episodes of ``task`` with ``seeds`` on ``min(num_envs, len(seeds))`` envs, one client and one pool
    thread each; yields each episode as it finishes. Once ``interrupt`` is set the envs stop after their current
    step, and the episodes still running are dropped.

    Envs in one process (``sync``) step together and ask for their chunks together. Envs in processes of their own
    (``async``) each run their own loop in a lane: while one waits for its chunk the others step, so the server and
    the envs work at the same time rather than in turns, and the server batches whatever requests meet."""
    n = min(cfg.num_envs, len(seeds))
    mode = vector_mode(cfg, runner, n)
    queue = deque(seeds)
    stops = (interrupt,) if interrupt is not None else ()
    if mode == "sync" or n == 1:
        yield from _lane(cfg, runner, task, queue, video_seeds, clients[:n], pool, mode, schedule, n_obs, timing, stops)
    else:
        yield from _lanes(cfg, runner, task, queue, video_seeds, clients[:n], pool, schedule, n_obs, timing, stops)


_LANE_DONE = object()


def _lanes(cfg: EvalConfig, runner: Runner, task: str, queue: deque, video_seeds: Collection[int],
           clients: list[PolicyClient], pool: Executor, schedule: ChunkSchedule, n_obs: int,
           timing: Timing, stops: tuple[threading.Event, ...]) -> Iterator[FinishedEpisode]:
    """One lane (an env, its client and its own loop on a pool thread) per client, all drawing episodes from
    ``queue``; yields episodes as lanes finish them and raises the first lane's error."""
    finished: Queue = Queue()
    stop = threading.Event()
    timings = [Timing() for _ in clients]

    def drive(i: int) -> None:
        try:
            for episode in _lane(cfg, runner, task, queue, video_seeds, clients[i:i + 1], None, "async", schedule,
                                 n_obs, timings[i], (stop, *stops)):
                finished.put(episode)
        except BaseException as e:  # handed to the consumer, which raises it
            finished.put(e)
        finally:
            finished.put(_LANE_DONE)

    lanes = [pool.submit(drive, i) for i in range(len(clients))]
    try:
        running = len(lanes)
        while running:
            item = finished.get()
            if item is _LANE_DONE:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stop.set()
        for lane in lanes:
            lane.result()
        # Lanes run side by side: where a lane's time went, on average, is where the wall time went.
        for t in timings:
            timing.env_s += t.env_s / len(timings)
            timing.request_s += t.request_s / len(timings)
            timing.steps += t.steps


def _lane(cfg: EvalConfig, runner: Runner, task: str, queue: deque, video_seeds: Collection[int],
          clients: list[PolicyClient], pool: Executor | None, mode: str, schedule: ChunkSchedule, n_obs: int,
          timing: Timing, stops: tuple[threading.Event, ...] = ()) -> Iterator[FinishedEpisode]:
    """Episodes from ``queue`` on a vector env of ``len(clients)`` envs stepping together, until the queue is empty
    (or one of ``stops`` is set); requests go out on ``pool`` threads, or on this thread for a single env without a
    pool."""
    n = len(clients)
    vec = runner.make_vector_env(task, n, mode)
    try:
        prompt = vec.get_attr("prompt")[0]
        limit = min(cfg.max_steps or 10**9, *vec.get_attr("max_steps"))
        fps = vec.get_attr("fps")[0]
        space = vec.single_action_space
        slots = [None] * n

        def start(mask: np.ndarray) -> None:
            """Reset the masked envs into their next episodes (an env with none left idles on a fresh reset)."""
            reset_seeds = []
            for i in np.flatnonzero(mask):
                slots[i] = _next_episode(queue, task, prompt, schedule)
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

        start(np.ones(n, bool))
        while any(slots) and not any(s.is_set() for s in stops):
            asks = {i: ep for i, ep in enumerate(slots)
                    if ep is not None and ep.chunks.needs_chunk(ep.step)}
            args = {i: (clients[i], runner.request(_stacked(ep.history), ep.prompt),
                        (ep.seed * _SEED_STRIDE + ep.step) % (1 << 63)) for i, ep in asks.items()}
            waited = time.perf_counter()
            # Sent together on pool threads, so the server can batch them; a lone env asks on this thread.
            replies = {i: pool.submit(_request, *a) for i, a in args.items()} if pool is not None else None
            for i in args:
                ep = slots[i]
                try:
                    chunk, latency, infer = replies[i].result() if replies is not None else _request(*args[i])
                    ep.chunks.add(ep.step, chunk)
                except LongboatError as e:
                    raise EvalError(f"{task} seed {ep.seed}: {e}") from None
                ep.latency_ms.append(round(latency, 3))
                ep.infer_ms.append(round(infer, 3))
            timing.request_s += time.perf_counter() - waited
            actions = np.zeros((n, *space.shape), np.float32)
            for i, ep in enumerate(slots):
                if ep is not None:
                    actions[i] = runner.action(ep.chunks.action(ep.step), space)
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


def _next_episode(queue: deque, task: str, prompt: str, schedule: ChunkSchedule) -> _Episode | None:
    try:
        seed = queue.popleft()  # atomic: lanes share the queue
    except IndexError:
        return None
    return _Episode(task, seed, prompt, False, chunks=schedule.chunks())


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
