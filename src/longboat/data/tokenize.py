"""Tokenize text inputs into a Megatron ``.bin``/``.idx`` pair, in parallel and deterministically.

The main process reads raw batches in input order; worker processes (each holding the tokenizer)
parse and encode them; results are written in input order, so the output is identical for any
worker count. ``workers=1`` encodes in the calling process instead.

Processes or the tokenizer's own threads? ``tokenizers`` multithreads ``encode_batch``, but only the
Rust encoding: JSON parsing and turning ids into lists and arrays hold the GIL (about 10% of the
CPU time), and each batch waits for its longest document, so threads stop scaling early; processes
parallelise everything but cost CPU of their own. Measured on 2 shared, heavily loaded cores (32k
byte-level BPE, 3 interleaved runs, medians):

                                   in-process, backend threads     2 processes, no threads
    Shakespeare paragraphs, 2.5M   0.21M tokens/s, 0.57M/CPU-s     0.30M tokens/s, 0.50M/CPU-s
    stdlib modules, 3.1M tokens    0.28M tokens/s, 0.55M/CPU-s     0.22M tokens/s, 0.43M/CPU-s

Threads use the CPU better and processes win in wall time only sometimes, so with 2 cores or fewer
the default is in-process encoding with the backend's threads; with more cores, where threads stay
capped by the serial part, it is one process per core. Workers run with
``TOKENIZERS_PARALLELISM=false``: threads on top of processes only oversubscribe the cores.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from longboat.data.indexed import IndexedDatasetWriter, data_path, dtype_for_vocab, index_path, strip_suffix
from longboat.data.text_sources import Batch, batch_texts, expand_inputs, iter_batches
from longboat.data.tokenizer import Tokenizer, TokenizerError
from longboat.utils.outputs import staged_files

DEFAULT_BATCH_SIZE = 256


@dataclass
class TokenizeStats:
    """What one tokenize run produced."""

    documents: int
    tokens: int
    seconds: float
    skipped: int = 0  # documents that encoded to no tokens (empty text); not written

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        skipped = f", {self.skipped:,} empty skipped" if self.skipped else ""
        return (
            f"{self.documents:,} documents, {self.tokens:,} tokens in {self.seconds:.2f} s "
            f"({self.tokens_per_second:,.0f} tokens/s){skipped}"
        )


class _Encoder:
    """Batch → (concatenated tokens, per-document lengths); lives once per worker."""

    def __init__(self, tokenizer: Tokenizer, text_key: str, append_eod: bool):
        self.tokenizer = tokenizer
        self.text_key = text_key
        self.eod = tokenizer.eos_id if append_eod else None
        self.dtype = dtype_for_vocab(tokenizer.vocab_size)

    def __call__(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        ids = self.tokenizer.encode_batch(batch_texts(batch, self.text_key))
        ids = [d for d in ids if d]  # empty documents are skipped, as Megatron's preprocess does
        if self.eod is not None:
            for d in ids:
                d.append(self.eod)
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        tokens = np.fromiter(chain.from_iterable(ids), self.dtype, int(lengths.sum()))
        return tokens, lengths


_WORKER_ENCODER: _Encoder | None = None
# Encoders of live pools, by key: forked workers find theirs here instead of reloading the tokenizer.
_FOR_FORKED_WORKERS: dict[int, _Encoder] = {}


def _init_worker(key: int, tokenizer_dir: str, text_key: str, append_eod: bool) -> None:
    global _WORKER_ENCODER
    # Processes are the parallelism; backend threads on top only oversubscribe the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_ENCODER = _FOR_FORKED_WORKERS.get(key) or _Encoder(Tokenizer(tokenizer_dir), text_key, append_eod)


def _encode_in_worker(batch: Batch) -> tuple[np.ndarray, np.ndarray, int]:
    tokens, lengths = _WORKER_ENCODER(batch)
    return tokens, lengths, _n_docs(batch)


def _n_docs(batch: Batch) -> int:
    if batch.kind == "jsonl":
        return sum(1 for line in batch.items if line.strip())
    return len(batch.items)


def available_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_workers() -> int:
    """One process per core; on 2 cores or fewer, in-process encoding (see the module docstring)."""
    cores = available_cores()
    return cores if cores > 2 else 1


def _start_method() -> str:
    # fork starts workers at once and needs no __main__ guard in the caller's script; it is safe here
    # because the pool is made before any thread of ours starts. Elsewhere (macOS) fork is unsafe.
    return "fork" if sys.platform == "linux" else "spawn"


@contextmanager
def _worker_pool(workers: int, encoder: _Encoder, tokenizer_dir: str):
    """A process pool whose workers each hold the tokenizer, or None for in-process encoding."""
    if workers == 1:
        yield None
        return
    key = id(encoder)
    _FOR_FORKED_WORKERS[key] = encoder
    init = (key, tokenizer_dir, encoder.text_key, encoder.eod is not None)
    try:
        with mp.get_context(_start_method()).Pool(workers, initializer=_init_worker, initargs=init) as pool:
            yield pool
    finally:
        del _FOR_FORKED_WORKERS[key]


def _encoded_in_order(
    batches: Iterable[Batch], encoder: _Encoder, pool, workers: int
) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """Encode batches in-process (no pool) or in the pool, yielding results in input order."""
    if pool is None:
        for batch in batches:
            tokens, lengths = encoder(batch)
            yield tokens, lengths, _n_docs(batch)
        return
    pending: deque = deque()
    for batch in batches:
        pending.append(pool.apply_async(_encode_in_worker, (batch,)))
        # A bounded queue keeps memory flat; Pool.imap would read the whole input ahead.
        if len(pending) >= 4 * workers:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def tokenize_to_indexed(
    inputs: Sequence[str | os.PathLike],
    tokenizer_dir: str | os.PathLike,
    output_prefix: str | os.PathLike,
    text_key: str = "text",
    append_eod: bool = True,
    workers: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    txt_mode: str = "file",
    progress: bool = True,
    overwrite: bool = False,
) -> TokenizeStats:
    """Tokenize every document of ``inputs`` (paths or globs) into ``output_prefix.bin/.idx``.

    One document = one jsonl row / parquet row / text file (or paragraph, or line, by ``txt_mode``);
    each becomes one sequence, ending with the tokenizer's eos when ``append_eod``. The pair appears only
    when both files are complete; an existing one is replaced only with ``overwrite``, an input never.
    """
    start = time.perf_counter()
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise TokenizerError(f"workers must be at least 1, got {workers}")
    paths = expand_inputs(inputs)
    prefix = _output_prefix(output_prefix)
    with staged_files([data_path(prefix), index_path(prefix)], overwrite, [*paths, tokenizer_dir]) as staged:
        documents, tokens, seen = _tokenize(paths, tokenizer_dir, prefix, staged, text_key, append_eod, workers,
                                            batch_size, txt_mode, progress, start)
    stats = TokenizeStats(documents, tokens, time.perf_counter() - start, skipped=seen - documents)
    if progress:
        print(f"{stats.summary()} -> {prefix}.bin/.idx", flush=True)
    return stats


def _output_prefix(output_prefix: str | os.PathLike) -> str:
    """``output_prefix`` without ``.bin``/``.idx``; one that names a directory (``dir/``) is refused, since it
    would write the hidden files ``dir/.bin`` and ``dir/.idx``."""
    prefix = strip_suffix(output_prefix)
    if prefix.endswith(("/", os.sep)) or Path(prefix).name in ("", ".", ".."):
        example = Path(prefix) / "corpus_text_document"
        raise TokenizerError(f"output prefix {str(output_prefix)!r} names a directory; give a file name prefix "
                             f"such as {example} (writes {example}.bin and {example}.idx)")
    return prefix


def _tokenize(paths, tokenizer_dir, prefix, staged, text_key, append_eod, workers, batch_size, txt_mode,
              progress, start) -> tuple[int, int, int]:
    """Write the documents of ``paths`` into the ``staged`` .bin/.idx; returns (documents, tokens, seen)."""
    tokenizer = Tokenizer(tokenizer_dir)
    if append_eod and tokenizer.eos_id is None:
        raise TokenizerError(
            f"{tokenizer_dir}: the tokenizer names no eos token to append; set eos_token in "
            f"tokenizer_config.json or tokenize without end-of-document tokens"
        )
    batches = iter_batches(paths, text_key=text_key, txt_mode=txt_mode, batch_size=batch_size)
    encoder = _Encoder(tokenizer, text_key, append_eod)
    documents = tokens = seen = 0
    with (
        _worker_pool(workers, encoder, str(tokenizer_dir)) as pool,
        IndexedDatasetWriter(prefix, encoder.dtype, files=staged) as writer,
        _Progress(progress, paths) as bar,
    ):
        for batch_tokens, lengths, n_docs in _encoded_in_order(batches, encoder, pool, workers):
            offset = 0
            for n in lengths.tolist():
                writer.add_document(batch_tokens[offset : offset + n])
                offset += n
            documents += len(lengths)
            seen += n_docs
            tokens += offset
            bar.update(documents, tokens, time.perf_counter() - start)
        if documents == 0:  # raised inside the writer, which then leaves no files behind
            raise TokenizerError(
                f"no text to tokenize in {_describe(paths)}: every document is empty; nothing was written to "
                f"{prefix}.bin/.idx"
            )
    return documents, tokens, seen


def _describe(paths: list[Path]) -> str:
    names = ", ".join(map(str, paths[:3]))
    return names + (f" and {len(paths) - 3} more files" if len(paths) > 3 else "")


class _Progress:
    """A live rich line on a terminal's stderr: documents, tokens, tokens/s, elapsed time."""

    def __init__(self, enabled: bool, paths: list[Path]):
        self.description = f"tokenizing {len(paths)} file{'s' if len(paths) != 1 else ''}"
        self._progress = None
        if enabled:
            from rich.console import Console

            console = Console(stderr=True)
            # Off a terminal (logs, CI) only the final summary line is useful.
            self._console = console if console.is_terminal else None

    def __enter__(self) -> "_Progress":
        if getattr(self, "_console", None) is not None:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn(
                    "{task.description}  {task.fields[docs]:,} documents  {task.fields[tokens]:,} tokens  "
                    "{task.fields[rate]:,.0f} tokens/s"
                ),
                TimeElapsedColumn(),
                console=self._console,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self.description, total=None, docs=0, tokens=0, rate=0.0)
        return self

    def update(self, documents: int, tokens: int, seconds: float) -> None:
        if self._progress is not None:
            rate = tokens / seconds if seconds > 0 else 0.0
            self._progress.update(self._task, docs=documents, tokens=tokens, rate=rate)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
