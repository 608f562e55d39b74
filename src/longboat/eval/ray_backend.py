"""``backend: ray``: the episodes run in Ray actors across a cluster; this process gathers them.

Each task's seeds still to run are cut into batches of ``ray.episodes_per_runner`` episodes. ``ray.runners`` Ray
actors (default: as many as the cluster's CPUs hold) take one batch after another; each steps ``num_envs`` envs of
its own with policy clients of its own and hands over each episode as it finishes (one actor call per episode:
plain calls also work through Ray Client, ``ray://``, where streaming generators do not), so the orchestrator
appends it to the results file at once, as the local backend does; workers never touch the output dir. When a
runner's process dies (a crash, a lost node), its batch's episodes not yet written run again on a new runner, up to
``ray.max_retries`` times; an error raised by the episodes themselves stops the evaluation, as it does locally.
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable
from urllib.parse import urlsplit

from longboat.config.base import ConfigError
from longboat.errors import LongboatError
from longboat.eval.config import EvalConfig
from longboat.eval.episodes import ChunkSchedule, EvalError, FinishedEpisode, Timing, policy_client, run_episodes
from longboat.eval.runners import Runner

log = logging.getLogger("longboat.eval")

_ANY_ADDRESS = ("0.0.0.0", "::", "[::]")


def import_ray():
    """Ray is an optional extra: imported here, or a one-line error saying how to install it."""
    try:
        import ray
    except ModuleNotFoundError as e:
        if e.name == "ray":
            raise ConfigError("backend: ray needs Ray, which is not installed: pip install 'longboat[ray]'") from None
        raise
    return ray


class _EpisodeRunner:
    """A Ray actor that runs batches of episodes, one at a time, on envs of its own, handing over each episode as it
    finishes. Its process and policy clients serve every batch it is given."""

    def __init__(self, cfg: EvalConfig, runner: Runner, video_seeds: set[int], url: str, schedule: ChunkSchedule,
                 n_obs: int):
        self.cfg, self.runner, self.video_seeds, self.url = cfg, runner, video_seeds, url
        self.schedule, self.n_obs = schedule, n_obs
        self.clients: list = []
        self.pool = ThreadPoolExecutor(cfg.num_envs, thread_name_prefix="longboat-eval")
        self._items = iter(())

    def run(self, task: str, seeds: list[int]) -> FinishedEpisode | Timing | None:
        """Start the batch ``seeds`` of ``task``; returns its first item, as ``next`` does."""
        if not self.clients:  # connected here, not in __init__: a server that cannot be reached is a call's error
            self.clients = [policy_client(self.cfg, self.url) for _ in range(self.cfg.num_envs)]
        self._items = self._batch(task, seeds)
        return self.next()

    def next(self) -> FinishedEpisode | Timing | None:
        """The batch's next episode to finish; after its last, the batch's ``Timing``; then None."""
        return next(self._items, None)

    def _batch(self, task: str, seeds: list[int]):
        timing = Timing()
        yield from run_episodes(self.cfg, self.runner, task, seeds, self.video_seeds, self.clients, self.pool,
                                self.schedule, self.n_obs, timing)
        yield timing


def _connect(ray, cfg: EvalConfig) -> bool:
    """Join the cluster at ``ray.address`` (or start a local instance); True when this call started Ray."""
    if ray.is_initialized():
        return False
    address = cfg.ray.address
    try:
        if address is None:
            ray.init(include_dashboard=False)
        else:
            ray.init(address=address)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise EvalError(f"ray.address {address}: cannot join a Ray cluster ({type(e).__name__}: {e})") from None
    return True


def _worker_url(ray, url: str) -> str:
    """A server listening on all interfaces is reached at this machine's address in the cluster."""
    parts = urlsplit(url)
    if parts.hostname in _ANY_ADDRESS or f"[{parts.hostname}]" in _ANY_ADDRESS:
        return f"{parts.scheme}://{ray.util.get_node_ip_address()}:{parts.port}"
    return url


def run_on_ray(cfg: EvalConfig, runner: Runner, todo: dict[str, list[int]], video_seeds: set[int], url: str,
               schedule: ChunkSchedule, n_obs: int, record: Callable[[FinishedEpisode], None], done: set,
               timing: Timing) -> None:
    """Run the ``todo`` seeds of each task on runners; ``record`` each episode as it arrives (``done``: the
    (task, seed) pairs recorded so far, kept up to date by ``record``)."""
    ray = import_ray()
    started = _connect(ray, cfg)
    try:
        url = _worker_url(ray, url)
        if len(ray.nodes()) > 1 and urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1"):
            log.warning("the policy server at %s is reachable from this machine only; runners on other machines "
                        "will not reach it (set serve.host, or a policy URL they reach)", url)
        actor = ray.remote(_EpisodeRunner).options(num_cpus=cfg.ray.cpus_per_runner, max_restarts=0)
        size = cfg.ray.episodes_per_runner
        batches = deque((t, seeds[i:i + size], 0) for t, seeds in todo.items() for i in range(0, len(seeds), size))
        _dispatch(ray, cfg, lambda: actor.remote(cfg, runner, video_seeds, url, schedule, n_obs), batches, record,
                  done, timing)
    finally:
        if started:
            ray.shutdown()


def _dispatch(ray, cfg: EvalConfig, new_runner: Callable, batches: deque, record: Callable, done: set,
              timing: Timing) -> None:
    """Keep ``ray.runners`` runners busy with ``batches`` (task, seeds, runs so far) until all are done."""
    from ray.exceptions import RayError, RayTaskError

    pending: dict = {}  # the call in flight -> (its runner, task, seeds, runs of this batch so far)

    def assign(runner=None) -> None:
        """Give the next batch to ``runner`` (a new one when None), or let it go when none is left."""
        if batches:
            runner = runner or new_runner()
            task, seeds, runs = batches.popleft()
            pending[runner.run.remote(task, seeds)] = (runner, task, seeds, runs + 1)
        elif runner is not None:
            ray.kill(runner)  # frees its CPUs

    try:
        fit = int(ray.cluster_resources().get("CPU", 1) // cfg.ray.cpus_per_runner)
        for _ in range(min(len(batches), cfg.ray.runners or max(1, fit))):
            assign()
        while pending:
            [ready], _ = ray.wait(list(pending), num_returns=1)
            runner, task, seeds, runs = pending.pop(ready)
            try:
                item = ray.get(ready)
            except RayTaskError as e:
                ray.kill(runner)
                left = ", ".join(str(s) for s in seeds if (task, s) not in done)
                if isinstance(e.cause, EvalError):
                    raise EvalError(str(e.cause)) from None
                if isinstance(e.cause, LongboatError):
                    raise EvalError(f"{task} seeds {left}: {e.cause}") from None
                raise EvalError(f"{task} seeds {left}: the runner failed: {e}") from None
            except RayError as e:  # its process or node died: the episodes are deterministic, run them again
                ray.kill(runner)
                left = [s for s in seeds if (task, s) not in done]
                if left and runs > cfg.ray.max_retries:
                    raise EvalError(f"{task} seeds {', '.join(map(str, left))}: the runner died {runs} times "
                                    f"({type(e).__name__}: {e})") from None
                if left:
                    log.warning("%s seeds %s: the runner died (%s); running them again", task,
                                ", ".join(map(str, left)), type(e).__name__)
                    batches.appendleft((task, left, runs))
                assign()
                continue
            if item is None:
                assign(runner)
                continue
            pending[runner.next.remote()] = (runner, task, seeds, runs)
            if isinstance(item, Timing):
                timing.add(item)
            else:
                record(item)
    finally:
        for runner, *_ in pending.values():
            ray.kill(runner)
