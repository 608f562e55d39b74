"""Packed against padded fine-tuning: how much of each row is real tokens, and the Trainer's real-token throughput.

Sample lengths follow a chat-like lognormal distribution (median ``--median`` tokens, cut at ``--seq-len``). Rows are
the SFT task's (``longboat.data.chat.packing``): packed best-fit decreasing, each sample with its own segment id and
positions from 0, or one sample per row. Efficiency is the non-padding share of the rows (also shown for padding to the
longest sample of each group of ``--pad-batch``). Throughput is ``Trainer.train_step()`` as training runs it (batch
fetch, the LM loss with segments, backward, clipping, AdamW) on rows of ``--seq-len``: steps of the two alternate,
and real tokens/s is the rows' non-padding share over all samples times the tokens of a step, divided by the
median step time (a step's cost does not depend on how much of it is padding; its share varies a lot per row).

    python bench/sft_packing.py                     # tiny decoder, seq 2048
    python bench/sft_packing.py --clock cpu --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch

from longboat.data.chat.packing import ChatRows, best_fit_decreasing
from longboat.data.chat.supervision import Sample
from longboat.data.labels import IGNORE_INDEX
from longboat.models.llm import Decoder, DecoderConfig
from longboat.tasks.lm_loss import make_lm_loss
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.trainer.optim import OptimizerConfig
from longboat.trainer.schedule import ScheduleConfig
from longboat.trainer.trainer import Trainer


def pack_rows(lengths: list[int], seq_len: int) -> list[list[int]]:
    """The one place the benchmark packs: the SFT task's best-fit decreasing."""
    return best_fit_decreasing(lengths, seq_len)


def sample_lengths(n: int, median: float, sigma: float, seq_len: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), 2, seq_len).astype(int).tolist()


def make_samples(lengths: list[int], vocab: int, seed: int) -> list[Sample]:
    """Random tokens; the first quarter of each sample (its prompt) is unsupervised."""
    rng = np.random.default_rng(seed)
    samples = []
    for n in lengths:
        labels = rng.integers(0, vocab, n, dtype=np.int32)
        labels[: n // 4] = IGNORE_INDEX
        samples.append(Sample(rng.integers(0, vocab, n, dtype=np.int32), labels))
    return samples


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--median", type=float, default=300, help="median sample length in tokens")
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal shape: the spread of sample lengths")
    p.add_argument("--samples", type=int, default=20000, help="samples for the efficiency figures")
    p.add_argument("--batch", type=int, default=2, help="rows per micro-batch in the timed steps")
    p.add_argument("--pad-batch", type=int, default=8, help="samples per batch when padding to the longest")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=688)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: this process's CPU time, steadier than wall time on a shared machine")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def make_trainer(args, dataset: ChatRows, run_dir: str) -> Trainer:
    cfg = DecoderConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                        n_kv_heads=args.kv_heads, ffn_dim=args.ffn, max_seq_len=args.seq_len)
    torch.manual_seed(0)
    train_cfg = TrainerConfig(
        steps=len(dataset) // args.batch, micro_batch_size=args.batch, optimizer=OptimizerConfig(lr=1e-4),
        schedule=ScheduleConfig(kind="constant"), device="cpu", log_every=10**9, num_workers=0, tensorboard=False,
    )
    loss = make_lm_loss(use_position_ids=True, use_segments=True)
    return Trainer(train_cfg, CheckpointConfig(export=False), run_dir, Decoder(cfg).train(), loss, dataset)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    lengths = sample_lengths(args.samples, args.median, args.sigma, args.seq_len, args.seed)
    packed = pack_rows(lengths, args.seq_len)
    single = [[i] for i in range(len(lengths))]
    by_batch = [single[i : i + args.pad_batch] for i in range(0, len(single), args.pad_batch)]
    longest = sum(len(b) * max(lengths[r[0]] for r in b) for b in by_batch)
    print(f"{len(lengths)} samples, lognormal median {args.median:g} sigma {args.sigma:g}, cut at {args.seq_len}: "
          f"mean {np.mean(lengths):.0f}, p90 {np.percentile(lengths, 90):.0f} tokens")
    samples = make_samples(lengths, args.vocab, args.seed)
    share = {"packed": ChatRows(samples, packed, args.seq_len, 0).efficiency,
             "padded": ChatRows(samples, single, args.seq_len, 0).efficiency}
    print(f"non-padding share  packed (BFD, {len(packed)} rows) {share['packed']:.3f}  one per row {share['padded']:.3f}"
          f"  one per row, padded to the longest of {args.pad_batch} {sum(lengths) / longest:.3f}")

    steps = args.warmup + args.repeats
    n_rows = steps * args.batch
    rng = np.random.default_rng(args.seed)
    timed_packed = [packed[i] for i in rng.choice(len(packed), n_rows, replace=False)]
    timed_single = [single[i] for i in rng.choice(len(single), n_rows, replace=False)]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        trainers = {
            "packed": make_trainer(args, ChatRows(samples, timed_packed, args.seq_len, 0), d1),
            "padded": make_trainer(args, ChatRows(samples, timed_single, args.seq_len, 0), d2),
        }
        seconds: dict[str, list[float]] = {name: [] for name in trainers}
        for step in range(steps):
            for name in (("packed", "padded") if step % 2 else ("padded", "packed")):
                start = clock()
                trainers[name].train_step()
                if step >= args.warmup:
                    seconds[name].append(clock() - start)
    unit = "tok/s" if args.clock == "wall" else "tok/cpu-s"
    med = {name: share[name] * args.batch * args.seq_len / statistics.median(t) for name, t in seconds.items()}
    print(f"decoder d_model {args.d_model}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, vocab "
          f"{args.vocab}; batch {args.batch} x {args.seq_len}; threads {args.threads}; median of {args.repeats}")
    print(f"Trainer.train_step real {unit}: packed {med['packed']:.0f}  padded {med['padded']:.0f}  "
          f"ratio {med['packed'] / med['padded']:.2f}x  (median step {statistics.median(seconds['packed']):.2f}s "
          f"packed, {statistics.median(seconds['padded']):.2f}s padded)")


if __name__ == "__main__":
    main()
