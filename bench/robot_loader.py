"""Robot policy training's loader: the policy task's own samples, as ``longboat train`` reads them, against
per-sample decoding as LeRobot's loader does it, both with the same transforms and float cameras.

The dataset is written by longboat's own writer: 2 cameras at 224×224 (AV1, LeRobot's default encoding), a 14-d
state and action, 30 fps. Each sample holds an 8-frame observation window of both cameras and the state, and a
50-step action chunk. Every loader is the trainer's (``ResumableLoader``, shuffled epochs, the same order), batch 8.

``baseline``: each camera of each sample opens its mp4, seeks to the keyframe before the first requested frame,
decodes forward converting every frame to an RGB tensor, picks the nearest frames, closes the file and hands float32
frames to the transforms, all in the workers (LeRobot's pyav path). ``workers``: the policy task with
``data.transforms_on=workers`` (longboat's decoder; cameras to float and transforms in the workers). ``device``:
``data.transforms_on=device``, what ``auto`` picks on an accelerator: cameras leave the workers as uint8, the
main process converts each batch to float and runs the transforms on it (``PolicyTask.batch_transforms``, timed:
on a CPU-only machine the main process's work, with an accelerator the device's: ``--device``).

Pipelines: ``normalize`` (cameras, state and action, mean/std); ``+ runs of 8`` (``data.epoch_run=8``: shuffled
epochs keep runs of neighbouring rows together, so a worker decodes each frame that neighbouring windows share once;
the baseline reads the same order but decodes every window afresh); ``+ crop`` (a random 200×200 crop first).
A second table times the same batches in one process in CPU seconds (which other load on the machine disturbs far
less): the workers' share per sample on each path, the device path's batch transforms when run on this CPU, and the
ratio of the baseline's worker time to the device path's, the loader's speed-up when an accelerator takes the
float work. ``--profile`` then profiles the device path in one process (reading, collating, converting,
transforming).

    python -P bench/robot_loader.py [--episodes 8] [--frames 120] [--batches 40] [--workers 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
import warnings
from pathlib import Path

import av
import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from longboat.data.loader import EpochBatchSampler, EpochOrder, ResumableLoader
from longboat.data.robot import RobotDataset, RobotDatasetWriter
from longboat.data.robot.windows import window_rows
from longboat.recipes.config import resolve
from longboat.tasks.policy_data import PolicyWindows
from longboat.utils.device import resolve_device

FPS = 30
SIZE = 224
CAMERAS = ("observation.images.top", "observation.images.wrist")
DIM = 14
WINDOW = {**{c: [i / FPS for i in range(-7, 1)] for c in CAMERAS}, "observation.state": [i / FPS for i in range(-7, 1)],
          "action": [i / FPS for i in range(50)]}


def camera_frame(cam: int, episode: int, t: int) -> np.ndarray:
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    phase = t / 6 + episode + cam * 2
    img = np.stack([128 + 90 * np.sin(x / 17 + phase), 128 + 90 * np.cos(y / 23 - phase),
                    128 + 60 * np.sin((x + y) / 31 + 2 * phase)], -1)
    return img.astype(np.uint8)


def make_dataset(root: Path, episodes: int, frames: int) -> None:
    features = {c: {"dtype": "video", "shape": [SIZE, SIZE, 3], "names": ["height", "width", "channels"]}
                for c in CAMERAS}
    features.update({k: {"dtype": "float32", "shape": [DIM], "names": None} for k in ("observation.state", "action")})
    rng = np.random.default_rng(0)
    with RobotDatasetWriter(root, FPS, features, robot_type="bench") as writer:
        for ep in range(episodes):
            for t in range(frames):
                frame = {c: camera_frame(i, ep, t) for i, c in enumerate(CAMERAS)}
                frame["observation.state"] = rng.normal(size=DIM).astype(np.float32)
                frame["action"] = rng.normal(size=DIM).astype(np.float32)
                writer.add_frame(frame, task="bench")
            writer.save_episode()




class PerSampleFrames(Dataset):
    """LeRobot's pyav loading of ``ours``' rows: every camera of every sample opens, seeks, decodes and closes its
    file; numeric columns come from the same arrays, so the two differ only in video decoding."""

    def __init__(self, ours: RobotDataset):
        self.ours, self.epoch_run = ours, ours.epoch_run

    def __len__(self) -> int:
        return len(self.ours)

    def __getitem__(self, row: int) -> dict:
        ds = self.ours
        ep = ds._row_episode[row]
        start, end = int(ds._ep_start[ep]), int(ds._ep_end[ep])
        item = {"task": ds.meta.tasks[int(ds.frames.numeric["task_index"][row])]}
        for key, deltas in ds.delta_indices.items():
            rows, pad = window_rows(row, start, end, deltas)
            item[f"{key}_is_pad"] = torch.from_numpy(pad)
            if key in ds.frames.numeric:
                item[key] = torch.from_numpy(ds.frames.numeric[key][rows])
                continue
            pos = ds.positions[ep]
            shift = ds.meta.episodes.video_start[key][pos]
            ts = [shift + float(t) for t in ds.frames.numeric["timestamp"][rows]]
            item[key] = decode_like_lerobot(ds.root / ds.meta.episodes.video_file[key][pos], ts, ds.tolerance_s)
        return item


def decode_like_lerobot(path: Path, timestamps: list[float], tolerance_s: float) -> torch.Tensor:
    container = av.open(str(path))
    stream = container.streams.video[0]
    container.seek(int(round(min(timestamps) / stream.time_base)), backward=True, any_frame=False, stream=stream)
    frames, pts = [], []
    for frame in container.decode(stream):
        frames.append(torch.as_tensor(frame.to_rgb().to_ndarray()).permute(2, 0, 1))
        pts.append(float(frame.pts * frame.time_base))
        if pts[-1] >= max(timestamps):
            break
    container.close()
    query, loaded = torch.tensor(timestamps, dtype=torch.float32), torch.tensor(pts, dtype=torch.float32)
    dist = torch.cdist(query[:, None], loaded[:, None], p=1)
    best, idx = dist.min(1)
    assert (best < tolerance_s).all(), (path, timestamps)
    return torch.stack([frames[i] for i in idx]).float() / 255



def policy_data(root: Path, transforms: list[dict], run: int, on: str):
    """The policy task's training samples, model config and task, as ``longboat train`` builds them."""
    cfg = {"task": "policy", "run_dir": str(root.parent / "bench_run"), "seed": 0,
           "model": {"arch": "mlp", "preset": "tiny", "n_obs_steps": 8, "horizon": 50},
           "data": {"path": str(root), "transforms": transforms, "epoch_run": run, "transforms_on": on},
           "train": {"device": "cpu", "steps": 1}}
    resolved = resolve(cfg)
    task = resolved.task
    data = task.build(resolved.model, resolved.cfg.train, 0, 1)
    return data.train, resolved.model, task


def samples_per_second(dataset: Dataset, transform, batches: int, workers: int, batch_size: int,
                       device: torch.device) -> float:
    """Steady-state samples/s of the trainer's loader, each batch moved to ``device`` as the trainer moves it and
    ``transform`` (the device path's) applied there."""
    loader = ResumableLoader(dataset, batch_size, num_workers=workers, epochs=EpochOrder(batch_size, seed=0),
                             pin_memory=device.type != "cpu")
    for _ in range(max(workers, 1)):  # each worker's first batch: start-up, not steady state
        next(loader)
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                 for k, v in next(loader).items()}
        if transform is not None:
            batch = transform(batch)
    if device.type != "cpu":
        torch.accelerator.synchronize()
    elapsed = time.perf_counter() - t0
    assert batch[CAMERAS[0]].dtype == torch.float32 and batch["action"].shape == (batch_size, 50, DIM)
    del loader  # its workers end before the next measurement starts
    return batches * batch_size / elapsed


def cpu_ms_per_sample(dataset: Dataset, transform, order: list[list]) -> tuple[float, float]:
    """CPU milliseconds per sample of one process reading and collating ``order``'s batches (the workers' share),
    and of ``transform`` on them (the device path's share, here on the CPU): what each costs whatever else the
    machine runs."""
    read = convert = 0.0
    for indices in order:
        start = time.process_time()
        batch = default_collate(dataset.__getitems__(indices))
        middle = time.process_time()
        if transform is not None:
            transform(batch)
        read, convert = read + middle - start, convert + time.process_time() - middle
    n = sum(map(len, order))
    return read / n * 1e3, convert / n * 1e3


def profile_device_path(dataset: PolicyWindows, transform, batches: int, batch_size: int, top: int = 12) -> None:
    """cProfile of the device path's work in one process: read, collate, convert and transform ``batches``."""
    sampler = EpochBatchSampler(len(dataset), batch_size, 0, 1, batch_size, 0, positioned=True,
                                run=dataset.epoch_run)
    order = [b for b, _ in zip(sampler, range(batches))]
    profiler = cProfile.Profile()
    profiler.enable()
    for indices in order:
        transform(default_collate(dataset.__getitems__(indices)))
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path.home() / ".cache/longboat/bench_robot_loader")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--run", type=int, default=8, help="epoch_run of the runs pipelines (default 8)")
    p.add_argument("--profile", action="store_true", help="then profile the device path of the last pipeline")
    p.add_argument("--device", default="auto", help="where batches go and the device path transforms (auto: the "
                                                     "accelerator if any, else the CPU)")
    args = p.parse_args()
    target = resolve_device(args.device)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores is asked for
    if not (args.root / "meta/info.json").is_file():
        t0 = time.perf_counter()
        make_dataset(args.root, args.episodes, args.frames)
        print(f"wrote {args.episodes * args.frames} frames × {len(CAMERAS)} cameras in {time.perf_counter() - t0:.1f}s"
              f" to {args.root}")
    normalize = {"type": "normalize", "features": {**{c: "mean_std" for c in CAMERAS},
                                                    "observation.state": "mean_std", "action": "mean_std"}}
    crop = {"type": "random_crop", "keys": list(CAMERAS), "size": [200, 200]}
    pipelines = {"normalize": ([normalize], 1), f"normalize + runs of {args.run}": ([normalize], args.run),
                 f"crop + normalize + runs of {args.run}": ([crop, normalize], args.run)}
    print(f"{args.workers} workers, batch {args.batch_size}, {args.batches} batches, {len(CAMERAS)} cameras {SIZE}², "
          f"8-frame windows, 50-step actions; batches to {target}; medians of {args.repeats}; samples/s")
    print(f"{'pipeline':<36} {'baseline':>9} {'workers':>9} {'device':>9} {'workers/base':>13} {'device/base':>12}")
    for name, (transforms, run) in pipelines.items():
        in_workers, _, _ = policy_data(args.root, transforms, run, "workers")
        on_device, model_cfg, task = policy_data(args.root, transforms, run, "device")
        baseline = PolicyWindows(PerSampleFrames(in_workers.frames), in_workers.pipeline, model_cfg, 0)
        loaders = {"baseline": (baseline, None), "workers": (in_workers, None),
                   "device": (on_device, task.batch_transforms[0])}
        rates: dict[str, list[float]] = {k: [] for k in loaders}
        for _ in range(args.repeats):
            for key, (dataset, transform) in loaders.items():
                rates[key].append(samples_per_second(dataset, transform, args.batches, args.workers,
                                                     args.batch_size, target))
        m = {k: statistics.median(r) for k, r in rates.items()}
        print(f"{name:<36} {m['baseline']:9.1f} {m['workers']:9.1f} {m['device']:9.1f} "
              f"{m['workers'] / m['baseline']:12.2f}× {m['device'] / m['baseline']:11.2f}×", flush=True)
    # The same batches in one process, in CPU time: what the workers spend per sample on each path, and what the
    # device path's batch transforms cost when the "device" is this CPU (on an accelerator they leave the CPU).
    torch.set_num_threads(1)
    print(f"\n{'CPU ms per sample, one process':<36} {'baseline':>9} {'workers':>9} {'device':>9} "
          f"{'+ on batch':>11} {'base/device':>12}")
    for name, (transforms, run) in pipelines.items():
        in_workers, _, _ = policy_data(args.root, transforms, run, "workers")
        on_device, model_cfg, task = policy_data(args.root, transforms, run, "device")
        baseline = PolicyWindows(PerSampleFrames(in_workers.frames), in_workers.pipeline, model_cfg, 0)
        sampler = EpochBatchSampler(len(on_device), args.batch_size, 0, 1, args.batch_size, 0, positioned=True,
                                    run=run)
        order = [b for b, _ in zip(sampler, range(args.batches))]
        (b, _), (w, _) = cpu_ms_per_sample(baseline, None, order), cpu_ms_per_sample(in_workers, None, order)
        d, on_batch = cpu_ms_per_sample(on_device, task.batch_transforms[0], order)
        print(f"{name:<36} {b:9.1f} {w:9.1f} {d:9.1f} {on_batch:11.1f} {b / d:11.2f}×", flush=True)
    if args.profile:
        torch.set_num_threads(1)
        profile_device_path(on_device, task.batch_transforms[0], args.batches, args.batch_size)


if __name__ == "__main__":
    main()
