"""A policy's training and inference speed on CPU, through the paths users run.

Training is ``Trainer.train_step()`` of the policy task (fetch a batch from the loader, forward, the policy's loss,
backward, clipping, AdamW), measured twice: with the task's own data pipeline (decoding, windows, transforms,
``train.num_workers`` loader workers) and with the same samples materialised beforehand, so the difference is
what data loading costs. Inference is the latency of one action chunk at batch 1 and 8: the model's ``predict``
alone, and the served path (``PolicyBundle.act``: transforms, predict, inverse transforms). ``--ddp`` adds
training steps/s under DDP on 2 gloo ranks against one process on the same global batch (both with materialised
samples, ``--threads`` each): efficiency = t(1) / (2 · t(2)).

The dataset is ``--dataset`` or a synthetic one written first (state, action and ``--cameras`` cameras of
``--image`` pixels, stored as parquet images like a recorded dataset).

    python bench/policy_train.py --arch mlp                  # default preset, one 84x84 camera
    python bench/policy_train.py --arch mlp --cameras 0 --ddp
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from worker_launch import launch as launch_worker, median_seconds, report as report_result


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="mlp", help="a registered policy architecture")
    p.add_argument("--preset", default="default")
    p.add_argument("--dataset", help="a LeRobot dataset (default: a synthetic one in a temporary directory)")
    p.add_argument("--cameras", type=int, default=1, help="cameras of the synthetic dataset")
    p.add_argument("--image", type=int, default=84, help="side of the synthetic cameras' square images")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--batch", type=int, default=32, help="global batch (samples per step)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="loader workers (train.num_workers)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each process")
    p.add_argument("--ddp", action="store_true", help="also 2 DDP ranks against 1 process")
    p.add_argument("--worker", choices=["single", "ddp"], help=argparse.SUPPRESS)
    return p.parse_args()


def write_dataset(root: Path, args: argparse.Namespace) -> Path:
    import numpy as np

    from longboat.data.robot import RobotDatasetWriter

    side = args.image
    features = {"observation.state": {"dtype": "float32", "shape": [8], "names": None},
                "action": {"dtype": "float32", "shape": [4], "names": None}}
    for c in range(args.cameras):
        features[f"observation.images.cam{c}"] = {"dtype": "image", "shape": [side, side, 3],
                                                  "names": ["height", "width", "channels"]}
    rng = np.random.default_rng(0)
    with RobotDatasetWriter(root, 10, features) as writer:
        for ep in range(args.episodes):
            for t in range(50):
                frame = {"observation.state": rng.normal(size=8).astype(np.float32),
                         "action": rng.normal(size=4).astype(np.float32)}
                for c in range(args.cameras):
                    frame[f"observation.images.cam{c}"] = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
                writer.add_frame(frame, task="bench")
            writer.save_episode()
    return root


def resolved_run(args: argparse.Namespace, dataset: str, run_dir: str, micro_batch: int, steps: int):
    from longboat.recipes.config import resolve

    return resolve({
        "task": "policy", "run_dir": run_dir,
        "model": {"arch": args.arch, "preset": args.preset},
        "data": {"path": dataset, "transforms": [
            {"type": "normalize", "features": {"observation.state": "mean_std", "action": "mean_std"}}]},
        "train": {"steps": steps, "micro_batch_size": micro_batch, "num_workers": args.workers,
                  "threads": args.threads, "tensorboard": False, "log_every": 10**6, "eval_batches": 0},
        "checkpoint": {"export": False},
    })


class Materialised:
    """Samples read once and served again (epochs repeat them): the trainer's step without reading costs."""

    positioned = True

    def __init__(self, samples: list[dict]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index[0] if isinstance(index, tuple) else index]


def trainer_for(resolved, data, train, dp=None, model=None, mesh=None):
    import torch

    from longboat.distributed import ParallelConfig
    from longboat.distributed.parallelize import parallelize
    from longboat.trainer.config import CheckpointConfig
    from longboat.trainer.trainer import Trainer

    if model is None:
        torch.manual_seed(0)
        model = parallelize(resolved.spec.build(resolved.model), mesh,
                            ParallelConfig(data_parallel="ddp") if mesh is not None else ParallelConfig())
    return Trainer(resolved.cfg.train, CheckpointConfig(export=False), resolved.cfg.run_dir, model, data.loss_fn,
                   train, dp=dp, hooks=resolved.task, device=torch.device("cpu"), seed=0)


def measure_single(args: argparse.Namespace, dataset: str) -> dict:
    """Training with and without data loading, and inference latency, in this process."""
    import torch

    from longboat.serving.policy_bundle import PolicyBundle

    torch.set_num_threads(args.threads)
    n = args.batch * (args.warmup + args.steps)
    with tempfile.TemporaryDirectory() as run_dir:
        resolved = resolved_run(args, dataset, run_dir, args.batch, args.warmup + args.steps)
        data = resolved.task.build(resolved.model, resolved.cfg.train, 0, 1)
        with_loading = median_seconds(trainer_for(resolved, data, data.train).train_step, args.warmup, args.steps)
        samples = Materialised([data.train[(i, i)] for i in range(min(n, len(data.train)))])
        without_loading = median_seconds(trainer_for(resolved, data, samples).train_step, args.warmup, args.steps)

        model = resolved.spec.build(resolved.model).eval()
        pipeline = resolved.task.pipeline(train=False)
        bundle = PolicyBundle(model, resolved.model, pipeline, {}, None, Path(dataset))
        frames = data.train.frames
        latency = {}
        for b in (1, 8):
            items = [frames[i] for i in range(b)]
            raw = {k: torch.stack([it[k] for it in items]) for k in data.train.keys if k != resolved.model.action_feature}
            obs = pipeline.apply(raw)
            keys = torch.arange(b, dtype=torch.int64)
            predict = lambda: model.predict(obs, noise_key=keys)  # noqa: E731
            act = lambda: bundle.act(raw, noise_key=keys)  # noqa: E731
            latency[f"predict_b{b}"] = median_seconds(predict, args.warmup, args.steps)
            latency[f"act_b{b}"] = median_seconds(act, args.warmup, args.steps)
    params = sum(p.numel() for p in model.parameters())
    return {"with_loading": with_loading, "without_loading": without_loading, "params": params, **latency}


def worker(args: argparse.Namespace) -> None:
    """Steps on materialised samples, in one process or one of 2 DDP ranks; rank 0 prints a RESULT line."""
    import torch

    from longboat.distributed import ParallelConfig, build_mesh, init_runtime, shutdown
    from longboat.trainer.trainer import DataParallel

    runtime = init_runtime("gloo", "cpu")
    ranks = runtime.world_size
    mesh = build_mesh(ParallelConfig(data_parallel="ddp"), "cpu") if runtime.distributed else None
    dp = DataParallel(mesh.dp_rank, mesh.dims.dp, mesh.dp_group) if mesh is not None else DataParallel()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as run_dir:
        resolved = resolved_run(args, args.dataset, run_dir, args.batch // ranks, args.warmup + args.steps)
        data = resolved.task.build(resolved.model, resolved.cfg.train, 0, ranks)
        n = min(args.batch * (args.warmup + args.steps), len(data.train))
        samples = Materialised([data.train[(i, i)] for i in range(n)])
        step_s = median_seconds(trainer_for(resolved, data, samples, dp, mesh=mesh).train_step, args.warmup, args.steps)
    if runtime.rank == 0:
        report_result({"ranks": ranks, "step_s": step_s})
    shutdown(runtime)


def launch(args: argparse.Namespace, mode: str, dataset: str) -> dict:
    """This script's worker ``mode`` in one process (``single``) or on 2 ranks under torchrun."""
    return launch_worker(str(Path(__file__).resolve()), [*sys.argv[1:], "--dataset", dataset, "--worker", mode],
                         1 if mode == "single" else 2, args.threads)


def report(args: argparse.Namespace, dataset: str) -> None:
    r = measure_single(args, dataset)
    print(f"{args.arch} ({args.preset}, {r['params'] / 1e6:.2f}M parameters) · {dataset} · global batch {args.batch} · "
          f"{args.threads} thread(s) · median of {args.steps} after {args.warmup} warmup")
    print(f"{'training':<34}{'ms/step':>10}{'steps/s':>10}{'samples/s':>11}")
    for name, key in ((f"with data loading ({args.workers} workers)", "with_loading"),
                      ("materialised samples", "without_loading")):
        print(f"{name:<34}{r[key] * 1e3:>10.1f}{1 / r[key]:>10.2f}{args.batch / r[key]:>11.0f}")
    print(f"{'inference, ms per action chunk':<34}{'batch 1':>10}{'batch 8':>10}")
    for name, key in (("predict", "predict"), ("act (transforms + predict)", "act")):
        print(f"{name:<34}{r[f'{key}_b1'] * 1e3:>10.2f}{r[f'{key}_b8'] * 1e3:>10.2f}")
    if args.ddp:
        one, two = launch(args, "single", dataset), launch(args, "ddp", dataset)
        print(f"{'DDP, materialised samples':<34}{'ms/step':>10}{'steps/s':>10}{'efficiency':>11}")
        print(f"{'1 process':<34}{one['step_s'] * 1e3:>10.1f}{1 / one['step_s']:>10.2f}{1.0:>11.2f}")
        print(f"{'2 ranks (gloo)':<34}{two['step_s'] * 1e3:>10.1f}{1 / two['step_s']:>10.2f}"
              f"{one['step_s'] / (2 * two['step_s']):>11.2f}")


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    if args.dataset:
        report(args, args.dataset)
        return
    with tempfile.TemporaryDirectory() as tmp:
        report(args, str(write_dataset(Path(tmp) / "dataset", args)))


if __name__ == "__main__":
    main()
