"""Time GPT index construction (document, sample and shuffle index) against megatron-core's C++-backed build.

    python bench/gpt_index.py                      # ~100M tokens, seq_len 2048, one epoch, medians of 3
    python bench/gpt_index.py --tokens 20e6 --epochs 3

Builds a synthetic uint16 ``.bin``/``.idx`` (random document lengths, mean ~1000 tokens) in a temporary
directory, then times a cold-cache build of ours and of megatron-core's ``GPTDataset`` (each into a fresh
cache directory, so both include saving the ``.npy`` files), and a warm start of ours. Checks that the
indices and a few samples are identical.
"""

from __future__ import annotations

from pathlib import Path

import argparse
import logging
import statistics
import tempfile
import time
import warnings

import numpy as np
import torch

from longboat.data.gpt import GPTDataset, GPTDatasetConfig
from longboat.data.indexed import IndexedDataset, IndexedDatasetWriter

EOD = 0


def write_synthetic(prefix: Path, tokens: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2000, size=int(tokens / 1000 * 1.05))
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]
    data = rng.integers(1, 50_000, size=int(lengths.sum()), dtype=np.uint16)
    ends = np.cumsum(lengths)
    data[ends - 1] = EOD
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for start, end in zip(ends - lengths, ends):
            writer.add_document(data[start:end])


class _Tokenizer:
    """What megatron-core's GPT dataset reads from a tokenizer."""

    eod, vocab_size = EOD, None
    unique_identifiers = {"class": "bench"}


def time_it(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=100e6)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=1, help="samples requested cover this many epochs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)

    from megatron.core.datasets.gpt_dataset import GPTDataset as MGPTDataset
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexedDataset
    from megatron.core.datasets.utils import Split

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        write_synthetic(tmp / "synthetic", int(args.tokens), args.seed)
        ours_file, mega_file = IndexedDataset(tmp / "synthetic"), MIndexedDataset(str(tmp / "synthetic"))
        n_docs, n_tokens = len(ours_file), ours_file.num_tokens
        num_samples = (args.epochs * n_tokens - 1) // args.seq_len
        print(f"data: {n_tokens:,} tokens in {n_docs:,} documents (written in {time.perf_counter() - t0:.1f}s); "
              f"seq_len {args.seq_len}, {num_samples:,} samples ({args.epochs} epoch(s))")

        runs = iter(range(10**6))

        def ours(cache: bool = True) -> GPTDataset:
            cache_dir = tmp / "ours" / (str(next(runs)) if cache else "warm")
            cfg = GPTDatasetConfig(seq_len=args.seq_len, seed=args.seed, eod_id=EOD, cache_dir=str(cache_dir))
            return GPTDataset(ours_file, (0, n_docs), num_samples, cfg, "train")

        def megatron() -> MGPTDataset:
            cfg = MConfig(
                random_seed=args.seed, sequence_length=args.seq_len, blend=([str(tmp / "synthetic")], None), split="1",
                path_to_cache=str(tmp / "megatron" / str(next(runs))), tokenizer=_Tokenizer(),
                reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
            )
            indices = np.arange(n_docs, dtype=np.int32)
            return MGPTDataset(mega_file, str(tmp / "synthetic"), indices, num_samples, Split.train, cfg)

        t_mega, theirs = time_it(megatron, args.repeats)
        t_ours, mine = time_it(ours, args.repeats)
        ours(cache=False)  # fill a cache, then time starts that hit it
        t_warm, warm = time_it(lambda: ours(cache=False), args.repeats)
        assert warm.from_cache

        for name in ("document_index", "sample_index", "shuffle_index"):
            assert np.array_equal(getattr(mine, name), getattr(theirs, name)), f"{name} differs"
        picks = np.random.default_rng(0).choice(len(theirs), min(20, len(theirs)), replace=False)
        for i in picks.tolist():
            assert torch.equal(mine[i]["tokens"], theirs[i]["tokens"]), f"sample {i} differs"
            assert torch.equal(warm[i]["tokens"], theirs[i]["tokens"]), f"sample {i} differs (cached)"

        print(f"megatron-core GPTDataset build (C++ sample index): {t_mega * 1e3:8.1f} ms  (median of {args.repeats})")
        print(f"longboat GPTDataset build (numpy), cold cache:     {t_ours * 1e3:8.1f} ms  (median of {args.repeats})")
        print(f"longboat GPTDataset, cache hit:                    {t_warm * 1e3:8.1f} ms")
        print(f"ratio longboat / megatron: {t_ours / t_mega:.2f}x; indices identical, {len(picks)} samples identical")


if __name__ == "__main__":
    main()
