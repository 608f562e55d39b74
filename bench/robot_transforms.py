"""Time of the robot transform pipeline users train with: a batch of observations (state, one camera) and
action chunks through delta actions, normalisation, dimension and horizon padding, resize with padding, random
crop and colour jitter; then evaluation mode, and ``unapply`` of a model's chunk back to robot actions.

    python -P bench/robot_transforms.py                          # 2 images of 224x224, chunk 50
    python -P bench/robot_transforms.py --height 480 --width 640  # camera frames resized to 224x224
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from longboat.data.robot.transforms import Pipeline

STATE, ACTION, CAMERA = "observation.state", "action", "observation.images.top"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--height", type=int, default=224)
    p.add_argument("--width", type=int, default=224)
    p.add_argument("--chunk", type=int, default=50)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def stats_of(dim: int) -> dict:
    x = np.random.default_rng(0).normal(size=(1000, dim))
    return {"mean": x.mean(0), "std": x.std(0), "min": x.min(0), "max": x.max(0),
            "q01": np.quantile(x, 0.01, 0), "q99": np.quantile(x, 0.99, 0)}


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    image_stats = {"mean": np.full((3, 1, 1), 0.5), "std": np.full((3, 1, 1), 0.25)}
    specs = [
        {"type": "delta_actions", "dims": [0, 1, 2, 3, 4, 5]},
        {"type": "normalize", "features": {STATE: "mean_std", ACTION: "quantiles", CAMERA: "mean_std"}},
        {"type": "pad_dim", "keys": [STATE, ACTION], "dim": 32},
        {"type": "pad_horizon", "horizon": args.chunk},
        {"type": "resize_pad", "keys": [CAMERA], "size": [224, 224]},
        {"type": "random_crop", "keys": [CAMERA], "size": [200, 200]},
        {"type": "color_jitter", "keys": [CAMERA], "brightness": 0.3, "contrast": 0.4, "saturation": 0.5, "hue": 0.05},
    ]
    pipeline = Pipeline.from_config(specs, {STATE: stats_of(8), ACTION: stats_of(7), CAMERA: image_stats})
    b = args.batch
    item = {STATE: torch.randn(b, 8), ACTION: torch.randn(b, args.chunk, 7),
            CAMERA: torch.rand(b, 3, args.height, args.width)}
    train = median_ms(lambda: pipeline.train().apply(item), args.repeats)
    evaluation = median_ms(lambda: pipeline.eval().apply(item), args.repeats)
    out = pipeline.eval().apply(item)
    unapply = median_ms(lambda: pipeline.unapply(out), args.repeats)
    print(f"batch {b} x 3x{args.height}x{args.width} image, chunk {args.chunk}, {args.threads} thread(s): "
          f"apply train {train:.2f} ms, apply eval {evaluation:.2f} ms, unapply {unapply:.3f} ms (medians)")


if __name__ == "__main__":
    main()
