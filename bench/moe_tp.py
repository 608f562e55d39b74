"""What splitting the experts over tensor parallel buys: a Qwen3-MoE-style decoder's training step on 2 gloo ranks.

Every run trains the same model on the same global batch through the real Trainer (``train_step``), and every
process gets the same number of threads. Three layouts:

- ``single``: one process;
- ``tp split``: tp 2 with the model's plan, every expert split by ffn width over the two ranks;
- ``tp replicated``: tp 2 with the routed experts replicated on both ranks (each runs all of them on the gathered
  sequence), the plan longboat had before experts were split, rebuilt here as the baseline.

It prints the median step time and the bytes of expert weights each rank holds.

    python bench/moe_tp.py                # d_model 256, 4 layers, 8 experts top-2, expert ffn 512
    python bench/moe_tp.py --threads 1    # threads of every process (2 ranks need 2 × threads cores)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from worker_launch import launch as launch_worker, lm_step_seconds, positive, report as report_result

MODES = ("single", "tp split", "tp replicated")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=positive, default=256)
    p.add_argument("--layers", type=positive, default=4)
    p.add_argument("--experts", type=positive, default=8)
    p.add_argument("--top-k", type=positive, default=2)
    p.add_argument("--ffn", type=positive, default=512, help="each expert's ffn width")
    p.add_argument("--vocab", type=positive, default=4096)
    p.add_argument("--seq", type=positive, default=256)
    p.add_argument("--batch", type=positive, default=4, help="global batch (samples per step)")
    p.add_argument("--steps", type=positive, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=positive, default=1, help="threads of each process")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.top_k > args.experts:
        p.error(f"--top-k {args.top_k} exceeds --experts {args.experts}")
    if args.ffn % 2:
        p.error(f"--ffn must be even (tp 2 splits every expert in two), got {args.ffn}")
    if args.d_model % 4:
        p.error(f"--d-model must be a multiple of the model's 4 heads, got {args.d_model}")
    return args


def replicated_experts_plan(cfg) -> dict:
    """The decoder's plan with each MoE layer run whole on every tp rank: gathered input, replicated output."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput

    from longboat.models.llm.parallel_plan import tensor_parallel_plan

    plan = tensor_parallel_plan(cfg)
    for i in range(cfg.n_layers):
        prefix = f"layers.{i}.feed_forward"
        if cfg.is_moe_layer(i):
            for key in [k for k in plan if k.startswith(prefix)]:
                del plan[key]
            plan[prefix] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
                output_layouts=(Replicate(), None), desired_output_layouts=(Shard(1), None),
            )
    return plan


def worker(args: argparse.Namespace) -> None:
    """One measured run (under torchrun for the tp modes); rank 0 prints a RESULT line."""
    import torch
    from torch.distributed.tensor import DTensor

    from longboat.distributed import ParallelConfig, build_mesh, init_runtime, shutdown
    from longboat.distributed.parallelize import parallelize
    from longboat.models import build_model, get_model
    from longboat.trainer.trainer import DataParallel

    runtime = init_runtime("gloo", "cpu")
    cfg = ParallelConfig(tp=runtime.world_size)
    mesh = build_mesh(cfg, "cpu") if runtime.distributed else None
    torch.manual_seed(0)
    moe = dict(d_model=args.d_model, n_experts=args.experts, top_k=args.top_k, expert_ffn_dim=args.ffn,
               aux_loss="switch")
    model = build_model("decoder", dict(
        vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=4, n_kv_heads=2, qk_norm=True,
        ffn_dim=4 * args.d_model, max_seq_len=args.seq, tie_embeddings=False, moe=moe,
    ))
    plan = None
    if mesh is not None:
        plan = get_model("decoder").tensor_parallel_plan(model.cfg, cfg.tp) if args.worker == "tp split" \
            else replicated_experts_plan(model.cfg)
    model = parallelize(model, mesh, cfg, plan, device=runtime.device)
    expert_bytes = sum((p.to_local() if isinstance(p, DTensor) else p).nbytes
                       for name, p in model.named_parameters() if ".experts." in name)
    dp = DataParallel(mesh.dp_rank, mesh.dims.dp, mesh.dp_group) if mesh is not None else DataParallel()
    step_s = lm_step_seconds(model, dp, runtime.device, vocab=args.vocab, seq=args.seq,
                             micro_batch=args.batch, threads=args.threads, warmup=args.warmup, steps=args.steps)
    if runtime.rank == 0:
        report_result({"mode": args.worker, "ranks": runtime.world_size, "step_s": step_s,
                       "expert_mb": expert_bytes / 2**20})
    shutdown(runtime)


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    print(f"MoE decoder d_model {args.d_model} × {args.layers} layers, {args.experts} experts top-{args.top_k}, "
          f"expert ffn {args.ffn}; global batch {args.batch} × {args.seq} tokens; median of {args.steps} steps after "
          f"{args.warmup} warmup; {args.threads} thread(s) per process")
    results = {}
    for mode in MODES:
        ranks = 1 if mode == "single" else 2
        results[mode] = launch_worker(str(Path(__file__).resolve()), [*sys.argv[1:], "--worker", mode], ranks,
                                      args.threads)
    base = results["tp replicated"]["step_s"]
    for mode, r in results.items():
        print(f"{mode:14s} {r['ranks']} rank(s): {r['step_s'] * 1e3:8.1f} ms/step  "
              f"{args.batch * args.seq / r['step_s']:7.0f} tokens/s  expert weights {r['expert_mb']:6.1f} MiB/rank  "
              f"speed-up vs tp replicated {base / r['step_s']:.2f}x")


if __name__ == "__main__":
    main()
