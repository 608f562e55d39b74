"""``backend: ray``: the episodes run in Ray tasks across a cluster; this process gathers them.

Each task's seeds still to run are cut into Ray tasks of ``ray.episodes_per_runner`` episodes. A Ray task builds
its own ``num_envs`` envs and policy clients and yields each episode as it finishes (a streaming generator), so the
orchestrator appends it to the results file at once, as the local backend does; workers never touch the output dir.
A Ray task whose worker died (a crash, a lost node) runs again for its episodes not yet written, up to
``ray.max_retries`` times; an error raised by the episodes themselves stops the evaluation, as it does locally.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Callable
from urllib.parse import urlsplit

from longboat.config.base import ConfigError
from longboat.errors import LongboatError
from longboat.eval.config import EvalConfig
from longboat.eval.episodes import EvalError, FinishedEpisode, Timing, policy_client, run_episodes
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


def _runner_task(cfg: EvalConfig, runner: Runner, task: str, seeds: list[int], video_seeds: set[int], url: str,
                 replan: int, n_obs: int):
    """The body of one Ray task: ``seeds`` of ``task`` on envs of its own; yields each finished episode, then the
    task's ``Timing``."""
    timing = Timing()
    n = min(cfg.num_envs, len(seeds))
    with ExitStack() as stack:
        clients = [stack.enter_context(policy_client(cfg, url)) for _ in range(n)]
        pool = stack.enter_context(ThreadPoolExecutor(n, thread_name_prefix="longboat-eval"))
        yield from run_episodes(cfg, runner, task, seeds, video_seeds, clients, pool, replan, n_obs, timing)
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
               replan: int, n_obs: int, record: Callable[[FinishedEpisode], None], done: set, timing: Timing) -> None:
    """Run the ``todo`` seeds of each task in Ray tasks; ``record`` each episode as it arrives (``done``: the
    (task, seed) pairs recorded so far, kept up to date by ``record``)."""
    ray = import_ray()
    from ray.exceptions import RayError, RayTaskError

    started = _connect(ray, cfg)
    url = _worker_url(ray, url)
    if len(ray.nodes()) > 1 and urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1"):
        log.warning("the policy server at %s is reachable from this machine only; Ray tasks on other machines will "
                    "not reach it (set serve.host, or a policy URL they reach)", url)
    job = ray.remote(_runner_task).options(num_returns="streaming", num_cpus=cfg.ray.cpus_per_runner,
                                           max_retries=0)
    pending: dict = {}  # streaming generator -> (task, its seeds, runs so far)

    def submit(task: str, seeds: list[int], runs: int) -> None:
        pending[job.remote(cfg, runner, task, seeds, video_seeds, url, replan, n_obs)] = (task, seeds, runs + 1)

    size = cfg.ray.episodes_per_runner
    for task, seeds in todo.items():
        for i in range(0, len(seeds), size):
            submit(task, seeds[i:i + size], 0)
    try:
        while pending:
            [ready], _ = ray.wait(list(pending), num_returns=1)
            task, seeds, runs = pending.pop(ready)
            try:
                item = ray.get(next(ready))
            except StopIteration:
                continue
            except RayTaskError as e:
                left = ", ".join(str(s) for s in seeds if (task, s) not in done)
                if isinstance(e.cause, EvalError):
                    raise EvalError(str(e.cause)) from None
                if isinstance(e.cause, LongboatError):
                    raise EvalError(f"{task} seeds {left}: {e.cause}") from None
                raise EvalError(f"{task} seeds {left}: the Ray task failed: {e}") from None
            except RayError as e:  # the worker or its node died: the episodes are deterministic, run them again
                left = [s for s in seeds if (task, s) not in done]
                if not left:
                    continue
                if runs > cfg.ray.max_retries:
                    raise EvalError(f"{task} seeds {', '.join(map(str, left))}: the Ray task failed {runs} times "
                                    f"({type(e).__name__}: {e})") from None
                log.warning("%s seeds %s: the Ray task failed (%s); running it again", task,
                            ", ".join(map(str, left)), type(e).__name__)
                submit(task, left, runs)
                continue
            pending[ready] = (task, seeds, runs)
            if isinstance(item, Timing):
                timing.add(item)
            else:
                record(item)
    finally:
        for generator in pending:
            ray.cancel(generator, force=True)
        if started:
            ray.shutdown()
