"""What data parallelism costs on CPU: step time of FSDP2 and DDP on 2 gloo ranks against 1 process.

Every run trains the same Decoder on the same global batch through the real Trainer (``train_step``: forward,
backward, loss all-reduce, clipping, AdamW), and every process gets the same number of threads. Two ranks then
have twice the compute of one process: the ideal time ratio is 0.5, and efficiency = t(1) / (2 · t(2)) is the
share of that ideal left after communication and sharding.

    python bench/dist_overhead.py                 # launches: 1 process, then torchrun with 2 ranks (fsdp, ddp)
    python bench/dist_overhead.py --threads 2     # threads of every process (2 ranks need 2 × threads cores)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from worker_launch import launch as launch_worker, lm_step_seconds, report as report_result


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8, help="global batch (samples per step)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads of each process")
    p.add_argument("--worker", choices=["single", "fsdp", "ddp"], help=argparse.SUPPRESS)
    return p.parse_args()


def worker(args: argparse.Namespace) -> None:
    """One measured run (under torchrun for fsdp/ddp); rank 0 prints a RESULT line."""
    import torch

    from longboat.distributed import ParallelConfig, build_mesh, init_runtime, shutdown
    from longboat.distributed.parallelize import parallelize
    from longboat.models import build_model
    from longboat.trainer.trainer import DataParallel

    runtime = init_runtime("gloo", "cpu")
    ranks = runtime.world_size
    cfg = ParallelConfig(data_parallel="ddp" if args.worker == "ddp" else "fsdp")
    mesh = build_mesh(cfg, "cpu") if runtime.distributed else None
    torch.manual_seed(0)
    model = build_model("decoder", dict(
        vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=4, n_kv_heads=2,
        ffn_dim=int(args.d_model * 8 / 3) // 16 * 16, max_seq_len=args.seq, tie_embeddings=False,
    ))
    model = parallelize(model, mesh, cfg, device=runtime.device)
    dp = DataParallel(mesh.dp_rank, mesh.dims.dp, mesh.dp_group) if mesh is not None else DataParallel()
    step_s = lm_step_seconds(model, dp, runtime.device, vocab=args.vocab, seq=args.seq, micro_batch=args.batch // ranks,
                             threads=args.threads, warmup=args.warmup, steps=args.steps)
    if runtime.rank == 0:
        report_result({"mode": args.worker, "ranks": ranks, "threads": args.threads, "step_s": step_s})
    shutdown(runtime)


def launch(args: argparse.Namespace, mode: str) -> dict:
    """This script's worker ``mode`` in one process (``single``) or on 2 ranks under torchrun."""
    return launch_worker(str(Path(__file__).resolve()), [*sys.argv[1:], "--worker", mode],
                         1 if mode == "single" else 2, args.threads)


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    tokens = args.batch * args.seq
    print(f"Decoder d_model {args.d_model} × {args.layers} layers, vocab {args.vocab}; global batch {args.batch} × "
          f"{args.seq} tokens; median of {args.steps} steps after {args.warmup} warmup")
    base = None
    for mode in ("single", "fsdp", "ddp"):
        r = launch(args, mode)
        base = base or r["step_s"]
        print(f"{mode:6s} {r['ranks']} rank(s) × {r['threads']} thread(s): {r['step_s'] * 1e3:8.1f} ms/step  "
              f"{tokens / r['step_s']:8.0f} tokens/s  time ratio {r['step_s'] / base:.2f}  "
              f"efficiency {base / (r['ranks'] * r['step_s']):.2f}")


if __name__ == "__main__":
    main()
