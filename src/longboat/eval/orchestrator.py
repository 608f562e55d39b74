"""``longboat eval``: run every (task, seed) episode of a config against a policy server, append each finished
episode to ``results.jsonl``, then write ``summary.json`` and ``report.html``.

Per task, ``num_envs`` environments step together (gymnasium vector envs); the envs that need a new action chunk
ask the server at the same time (one client each, so the server batches them) and each uses ``replan_steps``
actions of its chunk. An episode ends at its first success, at the step limit (``time_limit``) or at the wall-clock
limit (``wall_time``). The request seed is a function of the episode seed and the step, so an episode replays the
same however the envs are laid out and whether the server restarted under it. A rerun with the same output dir
skips the episodes already in the results file.
"""

from __future__ import annotations

import json
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from longboat.config.base import ConfigError
from longboat.data.robot.record.progress import RecordProgress
from longboat.data.robot.record.recorder import DEFAULT_CAMERA_KEY
from longboat.errors import LongboatError
from longboat.eval.client import PolicyClient
from longboat.eval.config import EvalConfig
from longboat.eval.results import RESULTS_FILE, RUN_FILE, ResultsFile, summarize, write_summary
from longboat.eval.runners import ObservationSpec, Runner, make_runner
from longboat.eval.runners.base import FRAME_INFO, IMAGE_PREFIX, STATE_FEATURE

VIDEO_DIR = "videos"
_SEED_STRIDE = 1_000_003  # request seed = episode seed * stride + step


class EvalError(LongboatError, RuntimeError):
    """The evaluation cannot go on (the policy refused a request, the output dir holds another run)."""


@dataclass
class _Tally:  # what the progress bar shows per task
    name: str
    episodes: int = 0
    successes: int = 0


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


@dataclass
class Timing:
    """Where the wall time of the episodes went: stepping the envs (rendering included) and waiting for chunks."""

    env_s: float = 0.0
    request_s: float = 0.0
    steps: int = 0


@dataclass(frozen=True)
class PolicyInfo:
    spec: ObservationSpec
    horizon: int | None
    n_obs_steps: int
    fps: int | None
    tasks: list[str]


def policy_info(cfg: EvalConfig) -> PolicyInfo:
    """What the envs must render for the policy: from the export's ``policy.json`` (overridden by
    ``observation``), or from ``observation`` alone for a URL."""
    obs = cfg.observation
    manifest: dict = {}
    if not cfg.is_url:
        from longboat.recipes.serve import export_dir
        from longboat.tasks.policy import POLICY_SPEC

        path = export_dir(cfg.policy) / POLICY_SPEC
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: cannot read the policy's manifest ({e})") from None
    elif obs is None:
        raise ConfigError(f"policy {cfg.policy} is a URL: the config needs 'observation' (cameras, image_size, "
                          "state_dim) to know what to render")
    features = manifest.get("input_features", {})
    wire_keys = (obs.wire_keys if obs and obs.wire_keys else None) or manifest.get("wire_keys")
    if obs and obs.cameras:
        cameras, size = {c: c for c in obs.cameras}, obs.image_size
    else:
        keys = [f.removeprefix(IMAGE_PREFIX) for f in features if f.startswith(IMAGE_PREFIX)]
        cameras = {k: None if k == DEFAULT_CAMERA_KEY else k for k in keys}
        sizes = {features[IMAGE_PREFIX + k]["shape"][0] for k in keys}
        size = sizes.pop() if len(sizes) == 1 else (obs.image_size if obs else 128)
    state_dim = obs.state_dim if obs and obs.state_dim else (features.get(STATE_FEATURE, {}).get("shape") or [None])[0]
    if wire_keys is None:
        wire_keys = {IMAGE_PREFIX + c: IMAGE_PREFIX + c for c in cameras} | {STATE_FEATURE: STATE_FEATURE}
    video_camera = cfg.video_camera or next(iter(cameras.values()), None)
    spec = ObservationSpec(wire_keys=dict(wire_keys), cameras=cameras, image_size=size, state_dim=state_dim,
                           video_camera=video_camera, video_size=cfg.video_size)
    return PolicyInfo(spec, manifest.get("horizon"), int(manifest.get("n_obs_steps", 1)), manifest.get("fps"),
                      list(manifest.get("tasks", [])))


def _check_run(out: Path, cfg: EvalConfig) -> None:
    """A resumed run must be the same evaluation: the episodes already written would mean something else."""
    path, identity = out / RUN_FILE, cfg.identity()
    if path.exists():
        saved = json.loads(path.read_text())
        changed = sorted(k for k in identity if saved.get(k) != identity[k])
        if changed:
            raise EvalError(f"{out}: holds a run with different {', '.join(changed)}; use another output_dir")
    else:
        path.write_text(json.dumps(identity, indent=2) + "\n")


def run_eval(cfg: EvalConfig, progress: bool = True) -> dict:
    """Evaluate, resuming from ``output_dir``'s results file; returns the summary."""
    from longboat.eval.report import write_report

    out = Path(cfg.output_dir)
    info = policy_info(cfg)
    runner = make_runner(cfg.benchmark, info.spec)
    known = runner.tasks()
    unknown = [t for t in cfg.tasks if t not in known]
    if unknown:
        raise ConfigError(f"tasks: {cfg.benchmark} has no task {', '.join(unknown)}; known: {', '.join(known)}")
    out.mkdir(parents=True, exist_ok=True)
    _check_run(out, cfg)
    results, summary_timing = ResultsFile(out / RESULTS_FILE), None
    seeds = cfg.episode_seeds()
    todo = {t: [s for s in seeds if (t, s) not in results.done] for t in cfg.tasks}
    try:
        if any(todo.values()):
            with ExitStack() as stack:
                url = _endpoint(cfg, out, stack)
                clients = [stack.enter_context(PolicyClient(url, timeout_s=cfg.request_timeout_s,
                                                            connect_timeout_s=cfg.serve.startup_timeout_s + 30))
                           for _ in range(cfg.num_envs)]
                meta = clients[0].metadata
                horizon = int(meta.get("horizon") or info.horizon or 1)
                replan = min(cfg.replan_steps or horizon, horizon)
                n_obs = int(meta.get("n_obs_steps") or info.n_obs_steps)
                pool = stack.enter_context(ThreadPoolExecutor(cfg.num_envs, thread_name_prefix="longboat-eval"))
                tallies, timing = {t: _Tally(t) for t in cfg.tasks}, Timing()
                for e in results.episodes:
                    if e["task"] in tallies:
                        tallies[e["task"]].episodes += 1
                        tallies[e["task"]].successes += bool(e["success"])
                bar = stack.enter_context(RecordProgress(progress, len(cfg.tasks) * len(seeds)))
                for task in cfg.tasks:
                    if todo[task]:
                        video = set(seeds[:cfg.videos_per_task])
                        _run_task(cfg, runner, task, todo[task], video, clients, pool, replan, n_obs, results,
                                  out, lambda e: _advance(bar, tallies[e["task"]], e), timing)
                summary_timing = {"env_s": round(timing.env_s, 3), "request_s": round(timing.request_s, 3),
                                  "vector_steps": timing.steps}
    finally:
        results.close()
    summary = summarize(results.episodes, cfg.tasks)
    summary["policy"], summary["benchmark"] = cfg.policy, cfg.benchmark
    if summary_timing is not None:
        summary["this_run_timing"] = summary_timing
    write_summary(out, summary)
    write_report(out, summary, results.episodes)
    return summary


def _advance(bar: RecordProgress, tally: _Tally, episode: dict) -> None:
    tally.episodes += 1
    tally.successes += bool(episode["success"])
    bar.advance(tally)


def _endpoint(cfg: EvalConfig, out: Path, stack: ExitStack) -> str:
    if cfg.is_url:
        return cfg.policy
    from longboat.eval.server_manager import ServerManager
    from longboat.recipes.serve import export_dir

    s = cfg.serve
    args = [str(export_dir(cfg.policy)), "--batch-window-ms", str(s.batch_window_ms), "--max-batch", str(s.max_batch)]
    args += ["--device", s.device] if s.device else []
    args += ["--threads", str(s.threads)] if s.threads else []
    manager = stack.enter_context(ServerManager(args, out / "server.log", startup_timeout_s=s.startup_timeout_s))
    return f"ws://{manager.host}:{manager.port}"


def _request(client: PolicyClient, obs: dict, seed: int) -> tuple[np.ndarray, float, float]:
    start = time.perf_counter()
    reply = client.infer(obs, seed=seed)
    latency = (time.perf_counter() - start) * 1000
    return np.asarray(reply["actions"]), latency, float(reply.get("policy_timing", {}).get("infer_ms", 0.0))


def _run_task(cfg, runner: Runner, task, seeds, video_seeds, clients, pool, replan, n_obs, results, out, done,
              timing: Timing) -> None:
    n = min(cfg.num_envs, len(seeds))
    mode = cfg.vector if cfg.vector != "auto" else ("async" if runner.renders() and n > 1 else "sync")
    vec = runner.make_vector_env(task, n, mode)
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
                    episode = _finish(ep, bool(success[i]), failure, out, fps)
                    results.append(episode)
                    done(episode)
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


def _finish(ep: _Episode, success: bool, failure: str | None, out: Path, fps: int) -> dict:
    video = None
    if ep.frames:
        from longboat.eval.report import write_video

        video = f"{VIDEO_DIR}/{ep.task}/seed{ep.seed}.mp4"
        write_video(out / video, ep.frames, fps)
    return {"task": ep.task, "seed": ep.seed, "success": success, "reward": round(ep.reward, 6),
            "length": ep.step, "failure": failure, "latency_ms": ep.latency_ms, "infer_ms": ep.infer_ms,
            "wall_s": round(time.monotonic() - ep.started, 3), "video": video}
