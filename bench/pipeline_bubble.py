"""Pipeline bubbles on CPU: step time of each pipeline schedule on pp gloo ranks against its theoretical bubble.

Every run trains the same Decoder on the same global batch (``--micro-batches`` micro-batches of ``--micro-batch``
samples) through the real Trainer with one thread per process. Perfect pipelining would divide the
single-process step time by pp; the measured bubble is the share of the step beyond that,
1 - t(1) / (pp · t(pp)), next to the schedule's theoretical idle share (pp - 1) / (m + pp - 1) for GPipe and 1F1B,
divided by the virtual stages per rank for interleaved 1F1B. Communication and the uneven stages (embedding
on the first, head and loss on the last) add to the measured share.

    python bench/pipeline_bubble.py                      # pp 2 and 4 (needs 4 free cores for honest numbers)
    python bench/pipeline_bubble.py --micro-batches 16   # more micro-batches: smaller bubbles
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from worker_launch import launch as launch_worker, median_seconds, report as report_result

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=8, help="a multiple of every pp × virtual stages run")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=2, help="samples per micro-batch")
    p.add_argument("--micro-batches", type=int, default=8, help="micro-batches per step (train.grad_accum)")
    p.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--worker", help=argparse.SUPPRESS)  # "single" or "<schedule>:<virtual stages>"
    return p.parse_args()


def worker(args: argparse.Namespace) -> None:
    """One measured run (under torchrun for a pipeline); rank 0 prints a RESULT line."""
    import torch
    from torch.utils.data import Dataset

    from longboat.distributed import ParallelConfig, build_mesh, init_runtime, shutdown
    from longboat.distributed.pipeline import build_pipeline
    from longboat.models import build_model, get_model
    from longboat.tasks.lm_loss import make_lm_loss
    from longboat.trainer.config import CheckpointConfig, TrainerConfig
    from longboat.trainer.trainer import DataParallel, Trainer

    class RandomTokens(Dataset):
        def __len__(self):
            return (args.warmup + args.steps) * args.micro_batch * args.micro_batches

        def __getitem__(self, i):
            x = torch.randint(0, args.vocab, (args.seq + 1,), generator=torch.Generator().manual_seed(i))
            return {"tokens": x[:-1], "labels": x[1:]}

    runtime = init_runtime("gloo", "cpu")
    torch.manual_seed(0)
    model = build_model("decoder", dict(
        vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=4, n_kv_heads=2,
        ffn_dim=int(args.d_model * 8 / 3) // 16 * 16, max_seq_len=args.seq, tie_embeddings=False,
    ))
    loss = make_lm_loss(False)
    pipeline = None
    if runtime.distributed:
        schedule, virtual = args.worker.split(":")
        cfg = ParallelConfig(pp=runtime.world_size, pp_schedule=schedule, pp_virtual_stages=int(virtual))
        spec = get_model("decoder")
        model, pipeline = build_pipeline(model, spec.pipeline_split(model.cfg), build_mesh(cfg, "cpu"), cfg, loss,
                                         args.micro_batches, runtime.device, spec.parallel_units)
    train_cfg = TrainerConfig(
        steps=args.warmup + args.steps, micro_batch_size=args.micro_batch, grad_accum=args.micro_batches,
        num_workers=0, tensorboard=False, threads=1, log_every=10**6, eval_batches=0,
    )
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(train_cfg, CheckpointConfig(export=False), run_dir, model, loss, RandomTokens(),
                          dp=DataParallel(), device=runtime.device, pipeline=pipeline)
        torch.set_num_threads(1)
        step_s = median_seconds(trainer.train_step, args.warmup, args.steps)
    if runtime.rank == 0:
        report_result({"step_s": step_s})
    shutdown(runtime)


def theoretical_bubble(pp: int, m: int, virtual: int) -> float:
    return (pp - 1) / (m + pp - 1) / virtual


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    script = str(Path(__file__).resolve())
    m = args.micro_batches
    print(f"Decoder d_model {args.d_model} × {args.layers} layers, vocab {args.vocab}; {m} micro-batches of "
          f"{args.micro_batch} × {args.seq} tokens per step; median of {args.steps} steps after {args.warmup} "
          "warmup; one thread per process, gloo")
    single = launch_worker(script, [*sys.argv[1:], "--worker", "single"], 1, 1)["step_s"]
    print(f"1 process: {single * 1e3:.1f} ms/step\n")
    print(f"{'schedule':18s} {'pp':>3s} {'v':>2s} {'ms/step':>9s} {'ideal ms':>9s} {'bubble':>7s} {'theory':>7s}")
    for pp in args.pp:
        for schedule, virtual in SCHEDULES:
            if args.layers % (pp * virtual) or (schedule == "interleaved_1f1b" and m % pp) or \
                    (schedule == "1f1b" and m < pp):
                continue
            t = launch_worker(script, [*sys.argv[1:], "--worker", f"{schedule}:{virtual}"], pp, 1)["step_s"]
            ideal = single / pp
            print(f"{schedule:18s} {pp:3d} {virtual:2d} {t * 1e3:9.1f} {ideal * 1e3:9.1f} {1 - ideal / t:7.2f} "
                  f"{theoretical_bubble(pp, m, virtual):7.2f}")


if __name__ == "__main__":
    main()
