"""Robot-dataset loading speed: longboat's ``RobotDataset`` against per-sample decoding as LeRobot's loader does it.

The dataset is written by longboat's own writer: 2 cameras at 224×224 (AV1, LeRobot's default encoding),
a 14-d state and action, 30 fps. Each sample holds an 8-frame observation window of both cameras and the state,
and a 50-step action chunk. Both loaders run in a ``DataLoader`` with 4 workers, batch 8, in the same shuffled
order. The baseline opens the mp4, seeks to the keyframe before the first requested frame, decodes forward
converting every frame to an RGB tensor, picks the nearest frames and closes the file, for every camera of
every sample (LeRobot's pyav path); its numeric columns come from the same arrays as ours, so the two differ
only in video decoding.

    python -P bench/robot_loader.py [--episodes 8] [--frames 120] [--batches 40]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import av
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

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


def samples_per_second(dataset: Dataset, batches: int, workers: int, batch_size: int) -> float:
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=True,
                        generator=torch.Generator().manual_seed(0), prefetch_factor=2 if workers else None)
    it = iter(loader)
    for _ in range(max(workers, 1)):  # each worker's first batch: start-up, not steady state
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
    elapsed = time.perf_counter() - t0
    assert batch[CAMERAS[0]].shape == (batch_size, 8, 3, SIZE, SIZE) and batch["action"].shape[1] == 50
    return batches * batch_size / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path.home() / ".cache/longboat/bench_robot_loader")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores is asked for
    if not (args.root / "meta/info.json").is_file():
        t0 = time.perf_counter()
        make_dataset(args.root, args.episodes, args.frames)
        print(f"wrote {args.episodes * args.frames} frames × {len(CAMERAS)} cameras in {time.perf_counter() - t0:.1f}s"
              f" to {args.root}")
    ours = RobotDataset(args.root, delta_timestamps=WINDOW)
    baseline = samples_per_second(PerSampleDecode(ours), args.batches, args.workers, args.batch_size)
    fast = samples_per_second(ours, args.batches, args.workers, args.batch_size)
    print(f"per-sample open/seek/decode (LeRobot's pyav way): {baseline:7.1f} samples/s")
    print(f"longboat RobotDataset:                            {fast:7.1f} samples/s")
    print(f"ratio: {fast / baseline:.2f}×  ({args.workers} workers, batch {args.batch_size}, {args.batches} batches, "
          f"{len(CAMERAS)} cameras {SIZE}², 8-frame windows, 50-step actions)")


if __name__ == "__main__":
    main()
