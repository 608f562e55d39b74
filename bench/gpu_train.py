"""Training throughput and MFU of a ~1B Llama and of a mixture-of-experts decoder on GPUs: FSDP2 (bf16 params,
fp32 reduce), per-block torch.compile and selective activation checkpointing, on synthetic tokens.

    torchrun --nproc_per_node=1 bench/gpu_train.py                   # llama3.2-1b, then qwen3-moe-8l; one H200
    torchrun --nproc_per_node=8 bench/gpu_train.py --batch 2         # per-rank micro-batch; FSDP over 8 GPUs
    torchrun --nproc_per_node=1 bench/gpu_train.py --preset qwen3-moe-8l  # one model only
    torchrun --nproc_per_node=1 bench/gpu_train.py --tiny            # CPU dry run of the same code paths

qwen3-moe-8l is Qwen3-30B-A3B with 8 of its 48 layers (128 experts, 8 active; 5.6B parameters, 1.1B active): its
fp32 weights, gradients and AdamW state (16 bytes a parameter, 84 GiB) fit one 139 GiB H200 unsharded.

A step is ``Trainer.train_step()``, as training runs it: fetch a batch, forward, the pretraining loss, backward,
gradient clipping, AdamW and the schedule. Runs on torch >= 2.11.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from longboat.distributed import ParallelConfig, build_mesh, init_runtime, shutdown
from longboat.distributed.parallelize import parallelize
from longboat.models.llm import DECODER, DecoderConfig, load_preset
from longboat.tasks.lm_loss import make_lm_loss
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.trainer.mfu import peak_flops
from longboat.trainer.optim import OptimizerConfig
from longboat.trainer.trainer import DataParallel, Trainer

TINY = dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128)
TINY_MOE = {**TINY, "dense_layers": [0], "moe": dict(d_model=64, n_experts=4, top_k=2, expert_ffn_dim=32)}
# Shapes of published models cut down to fit one GPU: (preset, fields replaced).
CUT_PRESETS = {"qwen3-moe-8l": ("qwen3-30b-a3b", {"n_layers": 8})}
DEFAULT_PRESETS = ["llama3.2-1b", "qwen3-moe-8l"]


def model_fields(name: str) -> dict:
    base, changes = CUT_PRESETS.get(name, (name, {}))
    return {**load_preset(base), **changes}


class RandomTokens(Dataset):
    """Synthetic rows of ``seq`` tokens with pre-shifted labels, as the data layer serves them."""

    def __init__(self, n: int, seq: int, vocab: int):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.randint(0, self.vocab, (self.seq + 1,), generator=torch.Generator().manual_seed(i))
        return {"tokens": x[:-1], "labels": x[1:]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", nargs="+", default=DEFAULT_PRESETS,
                   help=f"presets run one after the other (also: {', '.join(CUT_PRESETS)})")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2, help="micro-batch per rank")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="steps not timed (compilation happens here)")
    p.add_argument("--ac", choices=["none", "full", "selective"], default="selective")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--tiny", action="store_true", help="a tiny model on CPU with gloo: checks the script, not speed")
    args = p.parse_args()
    if args.tiny:
        args.seq, args.batch, args.steps, args.warmup = 64, 2, 3, 1
    return args


def main() -> None:
    args = parse_args()
    cfg = ParallelConfig(
        param_dtype="bf16", reduce_dtype="fp32", activation_checkpointing=args.ac, compile=not args.no_compile,
        meta_init=True, backend="gloo" if args.tiny else "auto",
    )
    runtime = init_runtime(cfg.backend, "cpu" if args.tiny else "auto")
    if not runtime.distributed:
        raise SystemExit("start this script with torchrun, e.g. torchrun --nproc_per_node=1 bench/gpu_train.py")
    if runtime.device.type != "cuda" and not args.tiny:
        raise SystemExit("no CUDA device: run with --tiny for a CPU dry run")
    mesh = build_mesh(cfg, runtime.device.type)
    models = {"tiny": TINY, "tiny-moe": TINY_MOE} if args.tiny else {name: model_fields(name) for name in args.preset}
    for name, fields in models.items():
        line = bench_model(name, DecoderConfig(**{**fields, "max_seq_len": args.seq}), args, cfg, runtime, mesh)
        if runtime.rank == 0:
            print(line, flush=True)
    dist.barrier()
    shutdown(runtime)


def bench_model(name: str, model_cfg: DecoderConfig, args: argparse.Namespace, cfg: ParallelConfig, runtime,
                mesh) -> str:
    """Time ``args.steps`` training steps of one model after ``args.warmup``; its report line."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = DECODER.build(model_cfg)
    model = parallelize(model, mesh, cfg, device=runtime.device)
    dp = DataParallel(mesh.dp_rank, mesh.dims.dp, mesh.dp_group)
    n_steps = args.warmup + args.steps
    train_cfg = TrainerConfig(
        steps=n_steps, micro_batch_size=args.batch, clip_grad_norm=1.0, log_every=10**9, tensorboard=False,
        optimizer=OptimizerConfig(implementation="foreach" if args.tiny else "fused"),
        num_workers=0 if args.tiny else 2,
    )
    data = RandomTokens(n_steps * args.batch * dp.size, args.seq, model_cfg.vocab_size)
    on_gpu = runtime.device.type == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()

    times = []
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(
            train_cfg, CheckpointConfig(export=False), run_dir, model, make_lm_loss(False), data,
            flops_per_unit=float(model_cfg.flops_per_token(args.seq)), dp=dp, device=runtime.device,
        )
        for i in range(n_steps):
            if on_gpu:
                torch.cuda.synchronize()
            start = time.perf_counter()
            loss = trainer.train_step()["loss"]
            if on_gpu:
                torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    tokens_per_s = args.batch * args.seq * runtime.world_size / step_s
    mfu = peak_flops(runtime.device, torch.bfloat16).mfu(tokens_per_s * model_cfg.flops_per_token(args.seq)
                                                         / runtime.world_size)
    memory = f" · peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if on_gpu else ""
    active = f", {model_cfg.num_params(active=True) / 1e9:.2f}B active" if model_cfg.moe is not None else ""
    del trainer, model  # the next model's weights and optimizer state take their place
    if on_gpu:
        torch.cuda.empty_cache()
    return (
        f"{name} ({model_cfg.num_params() / 1e9:.2f}B{active}) · {runtime.world_size} × {runtime.device.type} · "
        f"batch {args.batch} × seq {args.seq} per rank · AC {cfg.activation_checkpointing} · compile {cfg.compile}\n"
        f"step {step_s * 1e3:.1f} ms · {tokens_per_s:,.0f} tokens/s · "
        f"{tokens_per_s / runtime.world_size:,.0f} tokens/s/device · MFU {mfu:.1%} · loss {float(loss):.3f}" + memory
    )


if __name__ == "__main__":
    main()
