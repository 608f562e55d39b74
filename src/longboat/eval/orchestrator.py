"""``longboat eval``: run every (task, seed) episode of a config against a policy server, append each finished
episode to ``results.jsonl``, then write ``summary.json`` and ``report.html``.

The episodes run in this process (``backend: local``, one task after another on ``num_envs`` envs) or in Ray
actors (``backend: ray``, see ``ray_backend``); either way this process alone writes the output dir: each episode is
appended to the results file as it finishes, its video written beside it. A rerun with the same output dir skips
the episodes already in the results file, whichever backend wrote them. How an episode is stepped: ``episodes``.
"""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from longboat.config.base import ConfigError
from longboat.errors import WorldError
from longboat.eval.config import EvalConfig
from longboat.eval.episodes import (EvalError, FinishedEpisode, Timing, policy_client, run_episodes,
                                   vector_mode)
from longboat.eval.results import (RESULTS_FILE, RUN_FILE, ResultsFile, read_results, summarize, write_json,
                                   write_summary)
from longboat.eval.runners import ObservationSpec, Runner, make_runner
from longboat.eval.runners.base import IMAGE_PREFIX, STATE_FEATURE
from longboat.sim.recorder import DEFAULT_CAMERA_KEY
from longboat.utils.interrupt import ctrl_c_sets
from longboat.utils.plugins import load_plugins
from longboat.utils.progress import RecordProgress

VIDEO_DIR = "videos"


@dataclass
class _Tally:  # what the progress bar shows per task
    name: str
    episodes: int = 0
    successes: int = 0


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
        from longboat.checkpoint.export import find_export
        from longboat.models.policy import is_lerobot_dir, lerobot_manifest
        from longboat.models.policy.manifest import POLICY_SPEC, read_policy_manifest

        if is_lerobot_dir(cfg.policy):  # a LeRobot policy directory: the manifest it is served with
            path = Path(cfg.policy) / "config.json"
            content = lerobot_manifest(cfg.policy)
        else:
            path = find_export(cfg.policy) / POLICY_SPEC
            try:
                content = path.read_bytes()
            except OSError as e:
                raise ConfigError(f"{path}: cannot read the policy's manifest ({e.strerror or e})") from None
        manifest = read_policy_manifest(content, str(path))
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


def _make_output_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir {out}: is a file; expected a directory (new, or an evaluation's to resume)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a parent is a file
        raise ConfigError(f"output_dir {out}: a parent of it is a file, not a directory") from None
    except OSError as e:
        raise WorldError(f"output_dir {out}: cannot create it ({e.strerror or e})") from None


def _check_run(out: Path, cfg: EvalConfig) -> None:
    """A resumed run must be the same evaluation: the episodes already written would mean something else. Results
    without the run file that says what they are are not counted either."""
    path, identity = out / RUN_FILE, cfg.identity()
    start_over = f"delete {out / RESULTS_FILE} (and {path.name}) to start over, or use another output_dir"
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise EvalError(f"{path}: not a run file ({e}); {start_over}") from None
        if not isinstance(saved, dict):
            raise EvalError(f"{path}: not a run file (expected an object, got {type(saved).__name__}); {start_over}")
        changed = sorted(k for k in identity if saved.get(k) != identity[k])
        if changed:
            raise EvalError(f"{out}: holds a run with different {', '.join(changed)}; use another output_dir")
        return
    results = out / RESULTS_FILE
    if results.exists() and read_results(results):
        raise EvalError(f"{results}: holds episodes but {path} is missing, so which evaluation wrote them is not "
                        f"known and they are not counted; {start_over}")
    write_json(path, identity)


def _check_sizes(cfg: EvalConfig, runner: Runner, spec: ObservationSpec, meta: dict) -> None:
    """The policy's action and state sizes (its metadata, the export's manifest) against the benchmark's, before
    the first episode. A wider action is allowed: a policy trained on several simulators pads its actions to the
    widest, and each env takes its own leading dimensions."""
    action_dim = meta.get("action_dim")
    state_key = next((w for w, f in spec.wire_keys.items() if f == STATE_FEATURE), None)
    shape = (meta.get("observation_shapes") or {}).get(state_key)
    reads = int(shape[-1]) if isinstance(shape, list) and shape else None
    for task in cfg.tasks:
        sim_state, sim_action = runner.sizes(task)
        where = f"{cfg.benchmark} {task}"
        if isinstance(action_dim, int) and sim_action and action_dim < sim_action:
            raise EvalError(f"the policy's actions have {action_dim} values, {where} takes {sim_action}: the policy "
                            f"was not trained for this benchmark")
        if sim_state and spec.state_dim and spec.state_dim < sim_state:
            raise EvalError(f"the policy reads a state of {spec.state_dim} values, {where} gives {sim_state}: the "
                            f"policy was not trained for this benchmark")
        sent = spec.state_dim or sim_state  # what the envs will send: zero-padded to state_dim when it is set
        if reads and sent and reads != sent:
            hint = f"; set observation.state_dim: {reads} to zero-pad it" if reads > sent else ""
            raise EvalError(f"the policy reads a state of {reads} values, {where} gives {sent}{hint}")


def run_eval(cfg: EvalConfig, progress: bool = True) -> dict:
    """Evaluate, resuming from ``output_dir``'s results file; returns the summary."""
    from longboat.eval.report import write_report

    out = Path(cfg.output_dir)
    load_plugins(cfg.plugins)  # a config built in code: its plugins (each imported once per process)
    info = policy_info(cfg)
    runner = make_runner(cfg.benchmark, info.spec)
    runner.plugins = tuple(cfg.plugins)
    known = runner.tasks()
    unknown = [t for t in cfg.tasks if t not in known]
    if unknown:
        raise ConfigError(f"tasks: {cfg.benchmark} has no task {', '.join(unknown)}; known: {', '.join(known)}")
    if cfg.backend == "ray":
        from longboat.eval.ray_backend import import_ray

        import_ray()  # missing Ray fails here, before a server starts
    _make_output_dir(out)
    _check_run(out, cfg)
    results, summary_timing = ResultsFile(out / RESULTS_FILE), None
    interrupted = threading.Event()
    seeds = cfg.episode_seeds()
    todo = {t: [s for s in seeds if (t, s) not in results.done] for t in cfg.tasks}
    todo = {t: s for t, s in todo.items() if s}
    try:
        if todo:
            if cfg.backend == "local" and vector_mode(cfg, runner, min(cfg.num_envs, len(seeds))) == "async":
                runner.start_worker_server()  # it imports the simulator while this process starts the policy server
            with ExitStack() as stack:
                url = _endpoint(cfg, out, stack)
                # Ray runners open their own clients; this process needs one only for the policy's metadata.
                clients = [stack.enter_context(policy_client(cfg, url))
                           for _ in range(cfg.num_envs if cfg.backend == "local" else 1)]
                meta = clients[0].metadata
                _check_sizes(cfg, runner, info.spec, meta)
                horizon = int(meta.get("horizon") or info.horizon or 1)
                # Actions used per chunk: the config's, else the policy's own (LeRobot's n_action_steps), else all.
                replan = min(cfg.replan_steps or int(meta.get("n_action_steps") or horizon), horizon)
                n_obs = int(meta.get("n_obs_steps") or info.n_obs_steps)
                tallies, timing = {t: _Tally(t) for t in cfg.tasks}, Timing()
                for e in results.episodes:
                    if e["task"] in tallies:
                        tallies[e["task"]].episodes += 1
                        tallies[e["task"]].successes += bool(e["success"])
                done = sum(t.episodes for t in tallies.values())
                bar = stack.enter_context(RecordProgress(progress, len(cfg.tasks) * len(seeds), completed=done))

                quotas = {t: VideoQuota(cfg.videos_per_task, seeds, [e for e in results.episodes if e["task"] == t])
                          for t in cfg.tasks}

                def record(finished: FinishedEpisode) -> None:
                    episode = _save(out, finished, quotas[finished.result["task"]])
                    results.append(episode)
                    _advance(bar, tallies[episode["task"]], episode)

                if cfg.backend == "ray":
                    from longboat.eval.ray_backend import run_on_ray

                    # Ray's workers take the seeds to film once: the first ones, as many as the quota.
                    video = set(seeds[:cfg.videos_per_task])
                    run_on_ray(cfg, runner, todo, video, url, replan, n_obs, record, results.done, timing)
                else:
                    pool = stack.enter_context(ThreadPoolExecutor(cfg.num_envs, thread_name_prefix="longboat-eval"))
                    stack.enter_context(ctrl_c_sets(interrupted))  # the envs stop between steps
                    for task, task_seeds in todo.items():
                        for finished in run_episodes(cfg, runner, task, task_seeds, quotas[task], clients, pool, replan,
                                                     n_obs, timing, interrupted):
                            record(finished)
                        if interrupted.is_set():
                            break
                summary_timing = {"env_s": round(timing.env_s, 3), "request_s": round(timing.request_s, 3),
                                  "vector_steps": timing.steps}
    finally:
        results.close()
    if interrupted.is_set():
        print(f"interrupted: {len(results.episodes)} episodes are in {out / RESULTS_FILE}; the same command resumes",
              file=sys.stderr, flush=True)
        raise KeyboardInterrupt
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


class VideoQuota:
    """Which of a task's episodes are filmed: every one, until ``per_outcome`` failures and ``per_outcome`` successes
    have videos (failures are what a report is opened for, and which episodes fail is known only at their end).
    Counts the videos already in the results, so a resumed run keeps filling the same quota. Thread-safe: env lanes
    read it at each reset while episodes finish."""

    def __init__(self, per_outcome: int, seeds: list[int], done: list[dict]):
        self.per_outcome = per_outcome
        self._seeds = set(seeds) if per_outcome > 0 else set()
        self._filmed = {True: 0, False: 0}
        self._lock = threading.Lock()
        for e in done:
            if e.get("video"):
                self._filmed[bool(e["success"])] += 1
        self._close_if_full()

    def __contains__(self, seed: object) -> bool:
        with self._lock:
            return seed in self._seeds

    def __iter__(self):
        with self._lock:
            return iter(sorted(self._seeds))

    def keep(self, success: bool) -> bool:
        """Whether a filmed episode with this outcome gets its video (counted when it does)."""
        with self._lock:
            if self._filmed[success] >= self.per_outcome:
                return False
            self._filmed[success] += 1
        self._close_if_full()
        return True

    def _close_if_full(self) -> None:
        if all(n >= self.per_outcome for n in self._filmed.values()):
            with self._lock:
                self._seeds = set()


def _save(out: Path, finished: FinishedEpisode, quota: VideoQuota | None = None) -> dict:
    """The episode's results line, its video written first when it was filmed and its outcome's quota has room."""
    episode = finished.result
    if finished.frames and (quota is None or quota.keep(bool(episode["success"]))):
        from longboat.eval.report import write_video

        episode["video"] = f"{VIDEO_DIR}/{episode['task']}/seed{episode['seed']}.mp4"
        write_video(out / episode["video"], finished.frames, finished.fps)
    return episode


def _endpoint(cfg: EvalConfig, out: Path, stack: ExitStack) -> str:
    if cfg.is_url:
        return cfg.policy
    from longboat.serving.server_manager import ServerManager
    from longboat.checkpoint.export import find_export
    from longboat.models.policy import is_lerobot_dir

    s = cfg.serve
    if not is_lerobot_dir(cfg.policy):  # served as it is
        find_export(cfg.policy)  # the export, or a run directory's (whose config's plugins the server imports)
    args = [cfg.policy, "--batch-window-ms", str(s.batch_window_ms), "--max-batch", str(s.max_batch)]
    args += ["--device", s.device] if s.device else []
    args += ["--threads", str(s.threads)] if s.threads else []
    args += ["--verbose"] if s.verbose else []
    args += ["--deterministic"] if s.deterministic else []
    args += [arg for plugin in s.plugins for arg in ("--plugin", plugin)]
    manager = stack.enter_context(ServerManager(args, out / "server.log", host=s.host,
                                                startup_timeout_s=s.startup_timeout_s))
    return f"ws://{manager.host}:{manager.port}"
