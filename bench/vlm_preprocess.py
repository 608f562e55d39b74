"""Images/s of Qwen-VL image preprocessing: longboat's ``QwenVLImageProcessor`` vs transformers'
``Qwen2VLImageProcessorPil`` (what transformers runs without torchvision) on the same PIL images, a mix of sizes,
one image per call as a loader calls it; rounds interleaved, medians. Both give the same pixel values (checked).

    python -P bench/vlm_preprocess.py                  # Qwen2.5-VL settings
    python -P bench/vlm_preprocess.py --family qwen3   # Qwen3-VL settings (patch 16)
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from PIL import Image

from longboat.data.images.qwen_vl import QWEN2_5_VL, QWEN3_VL, QwenVLImageProcessor

# (height, width): thumbnails, phone and camera photos, screenshots, a tall scan, an odd crop.
SIZES = [(224, 224), (480, 640), (720, 1280), (1080, 1920), (1536, 2048), (3024, 4032), (2200, 800), (37, 91),
         (333, 517), (768, 1024)]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=["qwen2.5", "qwen3"], default="qwen2.5")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def photo(height: int, width: int, seed: int) -> Image.Image:
    """Smooth colour with noise on top: what a resampling filter sees in a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1) * 200
    return Image.fromarray((base + rng.normal(0, 20, base.shape)).clip(0, 255).astype(np.uint8))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from transformers import Qwen2VLImageProcessorPil

    cfg = QWEN3_VL if args.family == "qwen3" else QWEN2_5_VL
    ours = QwenVLImageProcessor(cfg)
    theirs = Qwen2VLImageProcessorPil(
        size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels}, patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size, merge_size=cfg.merge_size, image_mean=list(cfg.image_mean),
        image_std=list(cfg.image_std))
    images = [photo(h, w, i) for i, (h, w) in enumerate(SIZES)]
    run_ours = lambda: [ours(image) for image in images]  # noqa: E731
    run_theirs = lambda: [theirs(images=[image], return_tensors="pt") for image in images]  # noqa: E731
    for a, b in zip(run_ours(), run_theirs()):  # warm-up, and the same result
        assert torch.equal(a.image_grid_thw, b["image_grid_thw"])
        assert (a.pixel_values - b["pixel_values"]).abs().max() <= 1e-6
    times: dict[str, list[float]] = {"longboat": [], "transformers": []}
    for _ in range(args.rounds):
        for name, fn in (("longboat", run_ours), ("transformers", run_theirs)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    rate = {name: len(images) / statistics.median(t) for name, t in times.items()}
    patches = sum(ours.grid(h, w)[0] * ours.grid(h, w)[1] for h, w in SIZES)
    print(f"{args.family}-VL preprocessing, {len(images)} images of mixed sizes ({patches} patches), "
          f"{args.threads} thread(s), median of {args.rounds} rounds:")
    for name, r in rate.items():
        print(f"  {name:13s} {r:8.1f} images/s")
    print(f"  ratio         {rate['longboat'] / rate['transformers']:8.2f}x")


if __name__ == "__main__":
    main()
