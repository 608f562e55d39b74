"""``record``: roll out each environment's scripted expert and write the episodes into one LeRobot v3.0 dataset.

Each frame holds the state before the step, the camera frames, the expert's action and what the step brought:
``next.reward``, ``next.success`` and ``next.done``. An episode ends at the first success or after ``max_steps``.
Environments whose state or action is shorter than the longest are zero-padded to it. Ctrl-C or SIGTERM keeps
the episodes saved so far as a valid dataset (or leaves nothing when none was saved); a dataset being
overwritten is replaced only by a complete recording, and an interrupted one leaves it as it was.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from longboat.data.robot.encode import VideoOptions
from longboat.data.robot.writer import RobotDatasetWriter
from longboat.sim.env import SimEnv
from longboat.sim.errors import RenderError, SimError
from longboat.sim.registry import make_env
from longboat.utils.interrupt import Interrupted, signals_set, stop_signal
from longboat.utils.outputs import check_output, check_place, staged_output
from longboat.utils.progress import RecordProgress

DEFAULT_CAMERA_KEY = "main"  # when the environments' default cameras differ in name
MAX_IMAGE_SIZE = 8704  # SVT-AV1, the default video codec, encodes frames at most 8704 pixels high


class RecordError(SimError):
    """A recording request is out of range (episodes, sizes, cameras), or its output cannot be written."""


@dataclass
class EnvResult:
    name: str
    episodes: int = 0
    successes: int = 0
    saved: int = 0
    frames: int = 0

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


@dataclass
class RecordResult:
    output: Path | None  # None when nothing was saved
    envs: list[EnvResult] = field(default_factory=list)
    frames: int = 0
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def frames_per_second(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0


def record(
    envs: Sequence[str],
    episodes_per_env: int,
    output: str | Path,
    cameras: Sequence[str] | None = None,
    image_size: int = 128,
    fps: int | None = None,
    max_steps: int | None = None,
    only_success: bool = False,
    seed: int = 0,
    video: VideoOptions | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> RecordResult:
    """Record ``episodes_per_env`` expert episodes of each of ``envs`` (``metaworld:reach-v3``, ``fetch:push``, ...)
    into a new dataset at ``output``. ``cameras`` names cameras every environment has (``observation.images.
    <name>``); by default each environment's own default camera, and ``()`` records no images. Episode ``i`` of
    an environment starts from seed ``seed + i``; ``only_success`` drops the episodes that did not succeed."""
    output = Path(output)
    for name, value, least in (("episodes", episodes_per_env, 1), ("image size", image_size, 8),
                               ("max steps", max_steps, 1), ("fps", fps, 1), ("seed", seed, 0)):
        if value is not None and value < least:
            raise RecordError(f"expected {name} >= {least}, got {value}")
    if image_size > MAX_IMAGE_SIZE:
        raise RecordError(f"expected image size <= {MAX_IMAGE_SIZE}, got {image_size}")
    if len(set(envs)) != len(envs) or not envs:
        raise RecordError(f"expected one or more distinct environments, got {list(envs)}")
    replacing = _check_output(output, overwrite)
    if not replacing:
        check_place(output)  # before the simulators start
    sims = [make_env(name) for name in envs]
    try:
        args = (sims, _camera_views(sims, cameras), episodes_per_env, output, image_size, fps, max_steps,
                only_success, seed, video, progress)
        if not replacing:
            return _record(*args, root=output, keep_partial=True)
        # The old dataset stays until its successor is complete; an interrupted recording leaves it as it was.
        with staged_output(output, overwrite) as stage:
            stage.rmdir()  # the writer makes the dataset directory itself, whole, when it closes
            return _record(*args, root=stage, keep_partial=False)
    finally:
        for sim in sims:
            sim.close()


def _record(sims, views, episodes, output, size, fps, max_steps, only_success, seed, video, progress, root,
            keep_partial):
    """Record into a new dataset at ``root``, reported as ``output``; ``keep_partial``: an interrupted recording
    keeps the episodes saved so far."""
    state_dim, action_dim = max(s.state_dim for s in sims), max(s.action_dim for s in sims)
    fps = fps or sims[0].fps
    features = {
        "observation.state": {"dtype": "float32", "shape": [state_dim], "names": None},
        "action": {"dtype": "float32", "shape": [action_dim], "names": None},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.success": {"dtype": "bool", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        **{f"observation.images.{key}": {"dtype": "video", "shape": [size, size, 3],
                                         "names": ["height", "width", "channels"]} for key in views},
    }
    for i, sim in enumerate(sims):  # GL and cameras fail here, before anything is written
        sim.reset(seed)
        for per_env in views.values():
            try:
                sim.render(per_env[i], size)
            except MemoryError:
                raise RenderError(f"{sim.name}: not enough memory to render {size}x{size} camera frames; "
                                  f"choose a smaller size") from None
    result = RecordResult(output, [EnvResult(s.name) for s in sims])
    writer = RobotDatasetWriter(root, fps, features, robot_type="+".join(sorted({s.robot_type for s in sims})),
                                video=video)
    start = time.perf_counter()
    with signals_set(threading.Event()) as stop:  # Ctrl-C and SIGTERM stop between frames
        try:
            with RecordProgress(progress, len(sims) * episodes) as bar:
                for i, (sim, res) in enumerate(zip(sims, result.envs)):
                    cams = {key: per_env[i] for key, per_env in views.items()}
                    for ep in range(episodes):
                        success, n = _episode(sim, writer, cams, size, state_dim, action_dim,
                                              max_steps or sim.max_steps, seed + ep, stop)
                        res.episodes += 1
                        res.successes += success
                        if success or not only_success:
                            writer.save_episode()
                            res.saved, res.frames, result.frames = res.saved + 1, res.frames + n, result.frames + n
                        else:
                            writer.clear_episode()
                        bar.advance(res)
                        if stop.is_set():
                            raise KeyboardInterrupt
        except KeyboardInterrupt:
            result.interrupted = True
        except BaseException:
            writer.abort()
            raise
        result.interrupted |= stop.is_set()
        if writer.episodes and (keep_partial or not result.interrupted):
            writer.clear_episode()
            writer.close()
        else:
            writer.abort()
            result.output = None
        result.interrupted |= stop.is_set()
    result.seconds = time.perf_counter() - start
    _report(result, kept=None if keep_partial else output)
    if result.interrupted:
        raise Interrupted(stop_signal(stop))
    if result.output is None:
        raise RecordError(f"{output}: no episode succeeded; nothing written")
    return result


def _episode(sim: SimEnv, writer, cams: dict[str, str], size: int, state_dim: int, action_dim: int,
             max_steps: int, seed: int, stop: threading.Event) -> tuple[bool, int]:
    """Buffer one episode in ``writer``; returns whether it succeeded and its length. Raises KeyboardInterrupt
    after the frame in which ``stop`` was set."""
    state = sim.reset(seed)
    success = False
    for t in range(max_steps):
        images = {f"observation.images.{key}": sim.render(cam, size) for key, cam in cams.items()}
        action = sim.expert_action()
        next_state, reward, success = sim.step(action)
        done = success or t == max_steps - 1
        writer.add_frame({"observation.state": _pad(state, state_dim), "action": _pad(action, action_dim),
                          "next.reward": np.float32(reward), "next.success": success, "next.done": done, **images},
                         task=sim.task)
        state = next_state
        if stop.is_set():
            raise KeyboardInterrupt
        if done:
            break
    return success, t + 1


def _pad(x: np.ndarray, n: int) -> np.ndarray:
    return np.pad(x, (0, n - x.size)) if x.size < n else x


def _camera_views(sims: list[SimEnv], cameras: Sequence[str] | None) -> dict[str, list[str]]:
    """Dataset camera key → the camera each environment renders for it."""
    if cameras is None:
        defaults = [s.cameras[0] for s in sims]
        return {defaults[0] if len(set(defaults)) == 1 else DEFAULT_CAMERA_KEY: defaults}
    for s in sims:
        missing = [c for c in cameras if c not in s.cameras]
        if missing:
            raise RecordError(f"{s.name} has no camera {', '.join(missing)}; its cameras: {', '.join(s.cameras)}")
    if len(set(cameras)) != len(cameras):
        raise RecordError(f"cameras {list(cameras)} name a camera twice")
    return {c: [c] * len(sims) for c in cameras}


def _check_output(output: Path, overwrite: bool) -> bool:
    """Whether ``output`` exists and may be replaced (the export rule; what is replaced must be a dataset)."""
    check_output(output, overwrite)
    if not (output.exists() or output.is_symlink()):
        return False
    if not output.is_dir() or (any(output.iterdir()) and not (output / "meta" / "info.json").is_file()):
        raise RecordError(f"{output}: exists and is not a LeRobot dataset; refusing to replace it")
    return True


def _report(result: RecordResult, kept: Path | None) -> None:
    for r in result.envs:
        if r.episodes:
            print(f"{r.name}: {r.successes}/{r.episodes} successful ({100 * r.success_rate:.0f}%), "
                  f"{r.saved} episodes saved, {r.frames} frames", file=sys.stderr, flush=True)
    saved = sum(r.saved for r in result.envs)
    where = f"to {result.output}" if result.output else "nothing written"
    if kept is not None and result.output is None:
        where += f"; {kept} left as it was"
    stop = "interrupted: " if result.interrupted else ""
    print(f"{stop}{saved} episodes, {result.frames} frames in {result.seconds:.1f} s "
          f"({result.frames_per_second:.1f} frames/s) {where}", file=sys.stderr, flush=True)
