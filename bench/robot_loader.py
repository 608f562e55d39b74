"""Robot-dataset loading speed: longboat's ``RobotDataset`` against per-sample decoding as LeRobot's loader does it.

The dataset is written by longboat's own writer: 2 cameras at 224×224 (AV1, LeRobot's default encoding),
a 14-d state and action, 30 fps. Each sample holds an 8-frame observation window of both cameras and the state,
and a 50-step action chunk. Both loaders run in the trainer's loader (``ResumableLoader``, shuffled epochs) with 4
workers, batch 8, in the same order. The baseline opens the mp4, seeks to the keyframe before the first requested
frame, decodes forward converting every frame to an RGB tensor, picks the nearest frames and closes the file, for
every camera of every sample, and hands float32 frames out of the worker (LeRobot's pyav path); its numeric
columns come from the same arrays as ours, so the two differ only in video decoding.

Settings, each against the baseline in the same order, runs interleaved, medians over ``--repeats``:
``float32``: our defaults, every row shuffled alone (LeRobot's order). ``uint8``: cameras leave the workers as
uint8 and the main process converts each batch to float32 (``RobotDataset.to_float``, timed: on a CPU it is the
main process's work, with an accelerator it is the device's). ``uint8 + runs``: also ``epoch_run=8``, shuffled
epochs that keep runs of 8 neighbouring rows together, so a worker decodes each frame that neighbouring windows
share once (the baseline cannot: it decodes every window afresh); reported with and without the conversion.
A second table times the same batches in one process in CPU seconds, which other load on the machine disturbs
far less than the loaders' samples/s.

    python -P bench/robot_loader.py [--episodes 8] [--frames 120] [--batches 40] [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
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


class PerSampleDecode(Dataset):
    """LeRobot's pyav loading: every camera of every sample opens, seeks, decodes and closes its file."""

    def __init__(self, ours: RobotDataset):
        self.ours = ours
        self.epoch_run = ours.epoch_run  # the same sample order as ours

    def __len__(self) -> int:
        return len(self.ours)

    def __getitem__(self, row: int) -> dict:
        ds = self.ours
        ep = ds._row_episode[row]
        start, end = int(ds._ep_start[ep]), int(ds._ep_end[ep])
        item = {}
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


def samples_per_second(dataset: Dataset, batches: int, workers: int, batch_size: int, to_float: bool) -> float:
    """Steady-state samples/s of the trainer's loader; ``to_float`` converts uint8 cameras here, as timed work."""
    loader = ResumableLoader(dataset, batch_size, num_workers=workers, epochs=EpochOrder(batch_size, seed=0))
    for _ in range(max(workers, 1)):  # each worker's first batch: start-up, not steady state
        next(loader)
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = next(loader)
        if to_float:
            batch = dataset.to_float(batch)
    elapsed = time.perf_counter() - t0
    assert batch[CAMERAS[0]].shape == (batch_size, 8, 3, SIZE, SIZE) and batch["action"].shape[1] == 50
    uint8 = getattr(dataset, "image_dtype", "float32") == "uint8" and not to_float
    assert batch[CAMERAS[0]].dtype == (torch.uint8 if uint8 else torch.float32)
    del loader  # its workers end before the next measurement starts
    return batches * batch_size / elapsed


def cpu_ms_per_sample(dataset: Dataset, order: list[list[int]], to_float: bool) -> float:
    """CPU time of one process reading and collating ``order``'s batches (and converting them): what the workers
    and the main process spend per sample, whatever else the machine runs."""
    ours = isinstance(dataset, RobotDataset)
    start = time.process_time()
    for rows in order:
        batch = default_collate(dataset.__getitems__(rows) if ours else [dataset[r] for r in rows])
        if to_float:
            dataset.to_float(batch)
    return (time.process_time() - start) / sum(map(len, order)) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path.home() / ".cache/longboat/bench_robot_loader")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--run", type=int, default=8, help="epoch_run of the runs settings (default 8)")
    args = p.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores is asked for
    if not (args.root / "meta/info.json").is_file():
        t0 = time.perf_counter()
        make_dataset(args.root, args.episodes, args.frames)
        print(f"wrote {args.episodes * args.frames} frames × {len(CAMERAS)} cameras in {time.perf_counter() - t0:.1f}s"
              f" to {args.root}")
    run = f"uint8 + runs of {args.run}"
    # setting: (dataset options, convert to float in the main process, the baseline it is compared with)
    settings = {"float32": ({}, True, "rows shuffled alone"), "uint8": ({"image_dtype": "uint8"}, True,
                "rows shuffled alone"), run: ({"image_dtype": "uint8", "epoch_run": args.run}, True, "runs"),
                f"{run}, batches uint8": ({"image_dtype": "uint8", "epoch_run": args.run}, False, "runs")}
    datasets = {name: RobotDataset(args.root, delta_timestamps=WINDOW, **opts) for name, (opts, _, _) in settings.items()}
    baselines = {"rows shuffled alone": PerSampleDecode(datasets["float32"]), "runs": PerSampleDecode(datasets[run])}
    rates: dict[str, list[float]] = {name: [] for name in [*baselines, *settings]}
    for _ in range(args.repeats):
        for name, ds in baselines.items():
            rates[name].append(samples_per_second(ds, args.batches, args.workers, args.batch_size, False))
        for name, (_, to_float, _) in settings.items():
            rates[name].append(samples_per_second(datasets[name], args.batches, args.workers, args.batch_size,
                                                  to_float))
    median = {name: statistics.median(r) for name, r in rates.items()}
    print(f"{args.workers} workers, batch {args.batch_size}, {args.batches} batches, {len(CAMERAS)} cameras {SIZE}², "
          f"8-frame windows, 50-step actions; medians of {args.repeats}")
    print(f"{'setting':<32} {'baseline':>9} {'longboat':>9} {'ratio':>7}   (samples/s)")
    for name, (_, _, base) in settings.items():
        b, f = median[base], median[name]
        print(f"{name:<32} {b:9.1f} {f:9.1f} {f / b:6.2f}×")
    # The same work in one process, timed in CPU seconds: the ratio a machine with a core per worker would see.
    torch.set_num_threads(1)
    print(f"\n{'CPU ms per sample, one process':<32} {'baseline':>9} {'longboat':>9} {'ratio':>7}")
    for name, (_, to_float, base) in settings.items():
        ds = datasets[name]
        sampler = EpochBatchSampler(len(ds), args.batch_size, 0, 1, args.batch_size, 0, run=ds.epoch_run)
        order = list(itertools.islice(iter(sampler), args.batches))
        b, f = cpu_ms_per_sample(baselines[base], order, False), cpu_ms_per_sample(ds, order, to_float)
        print(f"{name:<32} {b:9.1f} {f:9.1f} {b / f:6.2f}×")


if __name__ == "__main__":
    main()
