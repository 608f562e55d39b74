"""Throughput of the Trainer's own step against transformers' LlamaForCausalLM trained by hand, on CPU.

Ours is ``Trainer.train_step()`` as training runs it: fetch a batch from a map-style dataset, forward, the
pretraining task's loss, backward, gradient clipping, AdamW and the schedule. Theirs is LlamaForCausalLM with
the same config and weights: forward with ``labels`` (its own loss), backward, ``clip_grad_norm_`` and
``torch.optim.AdamW`` with the same hyper-parameters, under the same autocast. Both predict the same
``batch x seq`` tokens of the same rows. Steps of the two are interleaved so machine noise hits both, and the
median over repeats after warmup is reported.

    python bench/train_step.py                 # eager, fp32 and bf16 autocast
    python bench/train_step.py --compile       # adds torch.compile figures (ours: per block, as the product)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import nullcontext
from typing import Callable

import torch
from torch.utils.data import Dataset

from longboat.distributed import ParallelConfig
from longboat.distributed.parallelize import parallelize
from longboat.models.llm import Decoder, DecoderConfig
from longboat.models.llm.hf import get_hf_adapter
from longboat.tasks.lm_loss import make_lm_loss
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.trainer.optim import OptimizerConfig
from longboat.trainer.schedule import ScheduleConfig
from longboat.trainer.trainer import Trainer

OPTIMIZER = OptimizerConfig(lr=1e-4, implementation="foreach")
CLIP = 1.0


class TokenRows(Dataset):
    """Rows of ``seq + 1`` tokens served as the data layer serves them: inputs and pre-shifted labels."""

    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"tokens": self.rows[i, :-1], "labels": self.rows[i, 1:]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1376)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16 (bf16 = autocast)")
    p.add_argument("--compile", action="store_true", help="also measure torch.compile'd models")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: this process's CPU time, steadier than wall time on a shared machine")
    return p.parse_args()


def build_pair(args: argparse.Namespace) -> tuple[Decoder, torch.nn.Module]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = DecoderConfig(
        vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
        n_kv_heads=args.kv_heads, ffn_dim=args.ffn, max_seq_len=args.seq,
    )
    llama = get_hf_adapter("llama")
    hf_cfg = LlamaConfig(**llama.config_to_hf(cfg), attn_implementation="sdpa")
    torch.manual_seed(0)
    ours, theirs = Decoder(cfg), LlamaForCausalLM(hf_cfg)
    ours.load_state_dict(llama.state_dict_from_hf(theirs.state_dict(), cfg))  # same weights, same function
    return ours.train(), theirs.train()


def make_steps(
    args: argparse.Namespace, rows: torch.Tensor, run_dir: str, dtype: str, compile: bool
) -> tuple[Callable[[], float], Callable[[], float]]:
    """One training step of each side; both return the step's mean loss."""
    ours, theirs = build_pair(args)
    if compile:
        ours = parallelize(ours, None, ParallelConfig(compile=True))
        theirs.compile()
    train_cfg = TrainerConfig(
        steps=len(rows) // args.batch, micro_batch_size=args.batch, optimizer=OPTIMIZER,
        schedule=ScheduleConfig(kind="constant"), clip_grad_norm=CLIP, dtype=dtype, device="cpu",
        log_every=10**9, num_workers=0, tensorboard=False,
    )
    trainer = Trainer(
        train_cfg, CheckpointConfig(export=False), run_dir, ours, make_lm_loss(False), TokenRows(rows)
    )
    opt = torch.optim.AdamW(
        theirs.parameters(), lr=OPTIMIZER.lr, betas=OPTIMIZER.betas, eps=OPTIMIZER.eps,
        weight_decay=OPTIMIZER.weight_decay, foreach=True,
    )
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == "bf16" else nullcontext
    batches = iter(rows.split(args.batch))

    def step_ours() -> float:
        return trainer.train_step()["loss"]

    def step_theirs() -> float:
        # transformers shifts labels itself: the seq + 1 tokens of a row give the same seq predictions as ours.
        chunk = next(batches)
        with autocast():
            loss = theirs(input_ids=chunk, labels=chunk).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step_ours, step_theirs


def measure(
    step_ours: Callable[[], float], step_theirs: Callable[[], float], args: argparse.Namespace
) -> tuple[float, float, tuple[float, float]]:
    """Median step seconds of each side, and the first step's losses (equal when both compute the same)."""
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    def timed(fn: Callable[[], float]) -> float:
        start = clock()
        fn()
        return clock() - start

    first = (step_ours(), step_theirs())
    for _ in range(args.warmup - 1):
        step_ours()
        step_theirs()
    t_ours, t_theirs = [], []
    for i in range(args.repeats):
        # Alternate which goes first so slow drift in machine load does not favour one side.
        if i % 2:
            t_theirs.append(timed(step_theirs))
            t_ours.append(timed(step_ours))
        else:
            t_ours.append(timed(step_ours))
            t_theirs.append(timed(step_theirs))
    return statistics.median(t_ours), statistics.median(t_theirs), first


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    steps = max(args.warmup, 1) + args.repeats
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, args.vocab, (steps * args.batch, args.seq + 1), generator=g)
    tokens_per_step = args.batch * args.seq
    modes = ["eager", "compile"] if args.compile else ["eager"]
    print(f"config: d_model {args.d_model}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, "
          f"ffn {args.ffn}, vocab {args.vocab}; batch {args.batch} x seq {args.seq}; threads {args.threads}; "
          f"warmup {args.warmup}, repeats {args.repeats}; {args.clock} clock; torch {torch.__version__}")
    unit = "tok/s" if args.clock == "wall" else "tok/cpu-s"
    print(f"{'mode':8} {'dtype':5} {'ours ' + unit:>15} {'hf ' + unit:>13} {'ratio':>6}  first losses")
    for mode in modes:
        for dtype in args.dtypes.split(","):
            # Fresh models, optimizers and run directory per row so no state leaks between rows.
            with tempfile.TemporaryDirectory() as run_dir:
                steps_pair = make_steps(args, rows, run_dir, dtype, mode == "compile")
                t_ours, t_theirs, (l_ours, l_theirs) = measure(*steps_pair, args)
            print(f"{mode:8} {dtype:5} {tokens_per_step / t_ours:15.0f} {tokens_per_step / t_theirs:13.0f} "
                  f"{t_theirs / t_ours:6.2f}x  {l_ours:.4f} / {l_theirs:.4f}", flush=True)


if __name__ == "__main__":
    main()
