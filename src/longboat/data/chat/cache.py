"""A chat source's samples encoded once into ``<cache_dir>/sft-<hash>/`` and memory-mapped by every later run.

The hash covers everything the samples depend on: the source's files (path, size and a digest of their bytes),
the tokenizer's files, the resolved chat template and its special tokens, the template variables, the supervision
settings, ``seq_len``, the truncation policy and :data:`FORMAT_VERSION`. A directory holds ``tokens.bin`` and
``labels.bin`` (int32, every fitted sample end to end), ``starts.npy`` (each sample's offset), ``kept.npy`` (each
kept conversation's first sample: conversations the template refuses are not kept; one kept conversation may
have no sample left after fitting) and ``meta.json`` (the source's reports: malformed and refused rows by reason
with their row numbers, so a cached run reports and fails exactly as one that encodes; what fitting dropped).

The rows are read, parsed, normalised, rendered and tokenized by a process pool (``workers``) over chunks of
rows, in order, with a bounded number of chunks in flight; a source of one or two chunks is encoded in-process.
The directory is written under a temporary name and renamed, so a half-written cache is never read; one whose
files do not match its ``meta.json`` is moved aside and rebuilt. Under ``torch.distributed`` the training
recipe lets each node's local rank 0 build first (as for the GPT index cache); the others then find and map it.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from longboat.data.chat.builtin import resolve_chat_template
from longboat.data.chat.sources import (EXAMPLES_KEPT, Conversation, Malformed, SourceReport, normalise, parse_line,
                                        row_tools, source_rows)
from longboat.data.chat.supervision import ChatSupervisor, fit_samples
from longboat.data.index_cache import cache_key
from longboat.data.tokenizer import TOKENIZER_FILES, Tokenizer
from longboat.errors import LongboatError

FORMAT_VERSION = 1  # bump when the files or the encoding (supervision, fitting) change
CHUNK_ROWS = 256  # rows per task sent to a worker
ARRAYS = {"tokens": np.int32, "labels": np.int32}  # raw .bin files; starts/kept are .npy


class ChatCacheError(LongboatError, OSError):
    """The cache directory cannot be created or written."""


@dataclass(frozen=True)
class EncodeSettings:
    """What the encoded samples depend on besides the source (all picklable, for the workers)."""

    tokenizer: str
    chat_template: str | None
    template_kwargs: dict
    train_on: str
    history_rewrite: str
    seq_len: int
    truncation: str

    def supervisor(self) -> ChatSupervisor:
        tokenizer = Tokenizer(self.tokenizer)
        template, _ = resolve_chat_template(tokenizer, self.chat_template)
        return ChatSupervisor(tokenizer, template, self.template_kwargs, self.train_on, self.history_rewrite)


@dataclass
class EncodedSource:
    """One source's fitted samples: sample ``i`` is ``tokens[starts[i]:starts[i + 1]]``; kept conversation ``j``
    holds samples ``kept[j]:kept[j + 1]``. ``read_report`` counts unreadable rows, ``report`` adds refused ones."""

    tokens: np.ndarray
    labels: np.ndarray
    starts: np.ndarray
    kept: np.ndarray
    read_report: SourceReport
    report: SourceReport
    per_turn: int = 0
    counts: Counter = field(default_factory=Counter)  # boundary merges and what fitting dropped or cut
    directory: Path | None = None
    built_s: float | None = None  # seconds spent encoding; None when read from the cache

    @property
    def conversations(self) -> int:
        return len(self.kept) - 1


# ---- keys -------------------------------------------------------------------------------------------------------
def _digest_files(files: list[Path], root: Path) -> list[list]:
    out = []
    for f in files:
        h = hashlib.blake2b(digest_size=16)
        with f.open("rb") as stream:
            while block := stream.read(1 << 22):
                h.update(block)
        out.append([str(f.relative_to(root)) if f != root else f.name, f.stat().st_size, h.hexdigest()])
    return out


def source_fingerprint(path: str | os.PathLike) -> list[list]:
    """``[name, size, digest of the bytes]`` of the source's file, or of every file under its directory."""
    path = Path(path).resolve()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return _digest_files(files, path)


def describe(path: str, format: str, split: str | None, settings: EncodeSettings) -> dict:
    """Everything one source's cache depends on (its hash names the directory)."""
    supervisor_template, _ = resolve_chat_template(Tokenizer(settings.tokenizer), settings.chat_template)
    tokenizer_dir = Path(settings.tokenizer)
    tokenizer_files = [tokenizer_dir / n for n in TOKENIZER_FILES if (tokenizer_dir / n).is_file()]
    return {
        "version": FORMAT_VERSION, "source": str(Path(path).resolve()), "files": source_fingerprint(path),
        "format": format, "split": split, "tokenizer": _digest_files(tokenizer_files, tokenizer_dir),
        "template": hashlib.sha256(supervisor_template.source.encode()).hexdigest(),
        "special_tokens": supervisor_template.special_tokens,
        "template_kwargs": json.loads(json.dumps(settings.template_kwargs, sort_keys=True, default=str)),
        "train_on": settings.train_on, "history_rewrite": settings.history_rewrite, "seq_len": settings.seq_len,
        "truncation": settings.truncation,
    }


# ---- reports ----------------------------------------------------------------------------------------------------
def report_json(report: SourceReport) -> dict:
    return {"rows": report.rows, "malformed": [[r, n] for r, n in report.malformed.items()],
            "examples": report.examples, "first_example": report.first_example}


def report_from_json(path: str, data: dict) -> SourceReport:
    return SourceReport(path, data["rows"], Counter(dict(data["malformed"])), dict(data["examples"]),
                        data["first_example"])


def merge_report(into: SourceReport, part: SourceReport) -> None:
    """``part`` (the report of the rows after those ``into`` counted) added to ``into``, as one reading would."""
    into.rows += part.rows
    for reason, n in part.malformed.items():
        into.malformed[reason] += n
        kept = into.examples.setdefault(reason, [])
        kept += part.examples[reason][: EXAMPLES_KEPT - len(kept)]
    into.first_example = into.first_example or part.first_example


# ---- encoding a chunk of rows (in a worker, or in-process) ------------------------------------------------------
_WORKER: dict = {}


def _init_worker(settings: EncodeSettings, path: str, format: str, pooled: bool = True) -> None:
    if pooled:  # one thread a worker: the pool is the parallelism (the tokenizer's own would oversubscribe)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER.update(supervisor=settings.supervisor(), settings=settings, path=path, format=format)


def _encode_chunk(rows: list[tuple[int, Any]]) -> dict:
    """Rows ``(row number, jsonl line bytes or the parsed row)`` read, normalised, encoded and fitted."""
    settings: EncodeSettings = _WORKER["settings"]
    report = SourceReport(_WORKER["path"])
    conversations = []
    for row, raw in rows:
        parsed = list(parse_line(row, raw, report)) if isinstance(raw, bytes) else [(row, raw)]
        for row, value in parsed:
            report.rows += 1
            try:
                conversations.append(Conversation(normalise(value, _WORKER["format"]), row, row_tools(value)))
            except Malformed as e:
                report.count(row, e.reason, value, e.detail)
    encoded, stats = _WORKER["supervisor"].encode(conversations, _WORKER["path"])
    counts: Counter = Counter({"boundary merges": stats.boundary_merges})
    samples, per_conversation = [], []
    for i, conv_samples in enumerate(encoded):
        if i in stats.rejected:
            continue
        fitted = fit_samples(conv_samples, settings.seq_len, settings.truncation == "truncate", counts)
        samples += fitted
        per_conversation.append(len(fitted))
    empty = np.zeros(0, np.int32)
    return {
        "tokens": np.concatenate([s.tokens for s in samples]) if samples else empty,
        "labels": np.concatenate([s.labels for s in samples]) if samples else empty,
        "lengths": np.array([len(s) for s in samples], dtype=np.int64),
        "per_conversation": np.array(per_conversation, dtype=np.int64),
        "report": report, "per_turn": stats.per_turn, "counts": counts,
        "rejected": [(conversations[i].row, conversations[i].messages, why) for i, why in stats.rejected.items()],
    }


def _chunks(path: str, split: str | None) -> Iterator[list[tuple[int, Any]]]:
    """The source's rows in chunks; jsonl lines stay bytes (the workers parse them)."""
    chunk: list = []
    p = Path(path)
    if p.is_file() and p.suffix == ".jsonl":
        with p.open("rb") as f:
            rows = ((n, line) for n, line in enumerate(f, start=1) if line.strip())
            for item in rows:
                chunk.append(item)
                if len(chunk) == CHUNK_ROWS:
                    yield chunk
                    chunk = []
    else:
        for item in source_rows(p, split, SourceReport(path)):
            chunk.append(item)
            if len(chunk) == CHUNK_ROWS:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _start_method() -> str:
    # fork, as the DataLoader's workers: no __main__ guard needed in the caller's script, and the workers touch
    # nothing of the trainer's (threads, process group), only the tokenizer and the template. Elsewhere (macOS)
    # fork is unsafe.
    return "fork" if sys.platform == "linux" else "spawn"


def _encoded_chunks(path: str, format: str, split: str | None, settings: EncodeSettings,
                    workers: int) -> Iterator[dict]:
    """Each chunk's results in order: in-process for a source of at most two chunks or one worker."""
    chunks = _chunks(path, split)
    head = [c for _, c in zip(range(2), chunks)]
    if workers <= 1 or len(head) < 2:
        _init_worker(settings, path, format, pooled=False)
        for chunk in [*head, *chunks]:
            yield _encode_chunk(chunk)
        return
    with mp.get_context(_start_method()).Pool(workers, initializer=_init_worker,
                                              initargs=(settings, path, format)) as pool:
        pending: deque = deque()
        for chunk in [*head, *chunks]:
            pending.append(pool.apply_async(_encode_chunk, (chunk,)))
            if len(pending) >= 4 * workers:  # bounded: Pool.imap would read the whole source ahead
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ---- building and reading a cache directory ---------------------------------------------------------------------
def _build(final: Path, path: str, format: str, split: str | None, settings: EncodeSettings, workers: int,
           description: dict) -> None:
    started = time.perf_counter()
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise ChatCacheError(f"{final.parent}: cannot create the SFT cache there ({e.strerror}); set "
                             "data.cache_dir to a writable directory or data.cache: false") from None
    try:
        read_report, per_turn, counts = SourceReport(path), 0, Counter()
        lengths, per_conversation, rejected = [], [], []
        with (tmp / "tokens.bin").open("wb") as tokens, (tmp / "labels.bin").open("wb") as labels:
            for result in _encoded_chunks(path, format, split, settings, workers):
                tokens.write(result["tokens"].tobytes())
                labels.write(result["labels"].tobytes())
                lengths.append(result["lengths"])
                per_conversation.append(result["per_conversation"])
                merge_report(read_report, result["report"])
                per_turn += result["per_turn"]
                counts.update(result["counts"])
                rejected += result["rejected"]
        report = report_from_json(path, report_json(read_report))
        for row, messages, why in rejected:
            report.count(row, "rejected by template", messages, why)
        starts = np.concatenate([[0], np.cumsum(np.concatenate([np.zeros(0, np.int64), *lengths]))]).astype(np.int64)
        kept = np.concatenate([[0], np.cumsum(np.concatenate([np.zeros(0, np.int64), *per_conversation]))])
        np.save(tmp / "starts.npy", starts)
        np.save(tmp / "kept.npy", kept.astype(np.int64))
        meta = {"tokens": int(starts[-1]), "samples": len(starts) - 1, "read_report": report_json(read_report),
                "report": report_json(report), "per_turn": per_turn, "counts": dict(counts),
                "built_s": time.perf_counter() - started, "description": description}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False, default=str))
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first; its copy is identical
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read(directory: Path, path: str) -> EncodedSource:
    """The cache directory mapped; ValueError when its files are missing or do not match its ``meta.json``."""
    try:
        meta = json.loads((directory / "meta.json").read_text())
        n = meta["tokens"]
        arrays = {}
        for name, dtype in ARRAYS.items():
            file = directory / f"{name}.bin"
            if file.stat().st_size != n * np.dtype(dtype).itemsize:
                raise ValueError(f"{file.name} holds {file.stat().st_size} bytes, not {n} tokens")
            arrays[name] = np.memmap(file, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
        starts, kept = np.load(directory / "starts.npy", mmap_mode="r"), np.load(directory / "kept.npy")
        if len(starts) != meta["samples"] + 1 or int(starts[-1]) != n or int(kept[-1]) != meta["samples"]:
            raise ValueError("starts.npy or kept.npy does not match meta.json")
        return EncodedSource(
            arrays["tokens"], arrays["labels"], starts, kept, report_from_json(path, meta["read_report"]),
            report_from_json(path, meta["report"]), meta["per_turn"], Counter(meta["counts"]), directory)
    except (OSError, KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise ValueError(str(e)) from None


def encoded_source(path: str, format: str, split: str | None, settings: EncodeSettings, cache_dir: str | os.PathLike,
                   workers: int = 2, on_build=None) -> EncodedSource:
    """The source's samples from ``cache_dir/sft-<hash>``, encoded and saved there first when absent (or damaged).

    ``on_build(directory)`` is called before each encode (for messages and tests)."""
    description = describe(path, format, split, settings)
    final = Path(cache_dir) / f"sft-{cache_key(description)}"
    if final.is_dir():
        try:
            return _read(final, path)
        except ValueError as e:
            aside = final.with_name(f".{final.name}.damaged-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(final, aside)
                shutil.rmtree(aside, ignore_errors=True)
            except OSError:
                pass  # another process moved it first
            print(f"warning: {final}: damaged SFT cache ({e}); rebuilding it", file=sys.stderr)
    if on_build is not None:
        on_build(final)
    started = time.perf_counter()
    _build(final, path, format, split, settings, workers, description)
    try:
        out = _read(final, path)
    except ValueError as e:
        raise ChatCacheError(f"{final}: the SFT cache just written cannot be read back ({e})") from None
    out.built_s = time.perf_counter() - started
    return out
