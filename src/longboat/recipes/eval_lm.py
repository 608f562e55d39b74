"""``longboat eval-lm``: accuracy of a language model on an exact-match or a multiple-choice JSONL file.

Exact match: rows ``{"prompt": str | "messages": [...], "answer": str | [str, ...]}``; the model answers by
greedy decoding up to a stop id, and a row is correct when its answer equals one of the given ones after
normalisation (``strip``: surrounding whitespace; ``squad``: also lower case, punctuation, articles and runs of
whitespace, as SQuAD's evaluation does).

Multiple choice: rows ``{"context" | "prompt": str, "choices": [str, ...], "label": int}``, scored by
log-likelihood as lm-evaluation-harness scores them: each choice is the continuation ``delimiter + choice`` of
the context (whitespace ending the context moves into the continuation), ``acc`` picks the highest sum of
continuation log-probabilities, ``acc_norm`` the highest sum divided by the choice's length in UTF-8 bytes.

Rows of a model that reads images may carry ``"images": [paths relative to the data file]`` (filling the prompt's
placeholders in order, or put before its text when it holds none), or OpenAI-style image parts in ``messages``
(``{"type": "image", "image": path}``); they are read, preprocessed and expanded as the model's SFT data
(``recipes/image_prompts.py``) and scored or answered through the same path.

Batches are exact: choices are right-padded (causal attention never looks at the padding), and prompts are
decoded only with prompts of the same token length, so every answer equals the one decoded alone.
"""

from __future__ import annotations

import json
import re
import string
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from longboat.config.base import ConfigError, StrictModel
from longboat.errors import LongboatError
from longboat.models.llm.generation import generate
from longboat.models.registry import hooks_of
from longboat.data.chat.images import ImageRef, images_of
from longboat.data.chat.sources import Malformed
from longboat.recipes.generate import LoadedModel, check_messages, load_for_inference, until_stop
from longboat.recipes.image_prompts import collate, expand_ids, model_inputs, pixel_inputs, read_images, \
    require_images, with_placeholders
from longboat.utils.json_files import parse_json
from longboat.utils.logging import console
from longboat.utils.outputs import staged_file
from longboat.utils.stats import wilson_interval

Kind = Literal["exact_match", "multiple_choice"]


class EvalDataError(LongboatError, ValueError):
    """A row of an evaluation file is not in the expected form."""


class EvalLMConfig(StrictModel):
    data: Path
    kind: Literal["auto", "exact_match", "multiple_choice"] = "auto"  # auto: from the first row's keys
    batch_size: int = Field(8, ge=1)
    limit: int | None = Field(None, ge=1)  # score only the first rows
    max_new_tokens: int = Field(64, ge=1)
    chat: bool | None = None  # None: for exact match when the model has a chat template, never for multiple choice
    normalize: Literal["strip", "squad"] = "strip"
    delimiter: str = " "  # between context and choice; with chat the reply starts right after the template's prompt
    output: Path | None = None
    overwrite: bool = False  # replace an existing output file


@dataclass
class Row:
    line: int
    prompt: str | None = None
    messages: list[dict] | None = None
    answers: list[str] | None = None  # exact match
    choices: list[str] | None = None  # multiple choice
    label: int | None = None
    images: list[str] | None = None  # paths as the row gives them, relative to the data file
    refs: list[ImageRef] | None = None  # the row's images, read once the model is known


def read_rows(path: Path, kind: str = "auto", limit: int | None = None) -> tuple[Kind, list[Row]]:
    """The rows of a JSONL file and their kind; an error naming the file and line for the first malformed one."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such evaluation file")
    rows: list[Row] = []
    with open(path, "rb") as f:  # bytes: a line that is not UTF-8 is named like any other malformed line
        for line_no, line in enumerate(f, 1):
            if limit is not None and len(rows) == limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            obj = parse_json(line, str(path), EvalDataError, line=line_no)
            if not isinstance(obj, dict):
                raise EvalDataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            if kind == "auto":
                kind = "multiple_choice" if "choices" in obj else "exact_match"
            rows.append(_parse_row(obj, kind, where, line_no))
            for image in rows[-1].images or []:  # before the model loads; their contents once it has
                if not (path.parent / image).is_file():
                    raise EvalDataError(f"{where}: image {path.parent / image}: missing image")
    if not rows:
        raise EvalDataError(f"{path}: no rows")
    return kind, rows


def _parse_row(obj: dict, kind: str, where: str, line_no: int) -> Row:
    images = obj.get("images")
    if images is not None and not (isinstance(images, list) and all(isinstance(p, str) for p in images)):
        raise EvalDataError(f"{where}: 'images' must be a list of paths (relative to the data file), got {images!r}")
    row = _parse_text_row(obj, kind, where, line_no)
    row.images = images or None
    return row


def _parse_text_row(obj: dict, kind: str, where: str, line_no: int) -> Row:
    if kind == "exact_match":
        expected = "'prompt' or 'messages', and 'answer'"
        prompt, messages, answer = obj.get("prompt"), obj.get("messages"), obj.get("answer")
        answers = [answer] if isinstance(answer, str) else answer
        if not (isinstance(answers, list) and answers and all(isinstance(a, str) for a in answers)):
            raise EvalDataError(f"{where}: exact-match rows need {expected} (a string or a list of strings); "
                                f"got keys {sorted(obj)}")
        if (prompt is None) == (messages is None) or (prompt is not None and not isinstance(prompt, str)):
            raise EvalDataError(f"{where}: exact-match rows need {expected}: one of 'prompt' (a string) or "
                                f"'messages'; got keys {sorted(obj)}")
        if messages is not None:
            try:
                check_messages(messages, f"{where}: 'messages'", parts=True)
            except ConfigError as e:
                raise EvalDataError(str(e)) from None
        return Row(line_no, prompt=prompt, messages=messages, answers=answers)
    context = obj.get("context", obj.get("prompt"))
    choices, label = obj.get("choices"), obj.get("label")
    if not isinstance(context, str):
        raise EvalDataError(f"{where}: multiple-choice rows need 'context' (or 'prompt'), a string; "
                            f"got keys {sorted(obj)}")
    if not (isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) and c for c in choices)):
        raise EvalDataError(f"{where}: 'choices' must be a list of at least two non-empty strings, got {choices!r}")
    if type(label) is not int or not 0 <= label < len(choices):
        raise EvalDataError(f"{where}: 'label' must be an index into the {len(choices)} choices, got {label!r}")
    return Row(line_no, prompt=context, choices=choices, label=label)


def normalize_answer(text: str, mode: str) -> str:
    text = text.strip()
    if mode == "squad":
        text = "".join(c for c in text.lower() if c not in string.punctuation)
        text = " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())
    return text


def read_row_images(loaded: LoadedModel, rows: list[Row], path: Path) -> None:
    """Each row's images read from their headers (``row.refs``), image parts of its messages turned into placeholders
    and a prompt given one placeholder per image when it holds none; an error naming the row when one disagrees."""
    for row in rows:
        parts = row.messages is not None and any(isinstance(m["content"], list) for m in row.messages)
        if not row.images and not parts:
            continue
        where = f"{path}:{row.line}"
        found = require_images(loaded)
        if row.messages is None:
            row.prompt = with_placeholders(row.prompt, len(row.images), found.placeholder, where)
            row.refs = read_images(loaded, [path.parent / p for p in row.images], f"{where}: image")
            continue
        try:
            flat, row.refs = images_of({"messages": row.messages, "images": row.images}, found.placeholder,
                                       path.parent, found.reader.processor)
        except Malformed as e:
            raise EvalDataError(f"{where}: {e.reason} ({e.detail})") from None
        row.messages = flat["messages"]


def with_images(loaded: LoadedModel, row: Row, ids: list[int], start: int | None = None, where: str = ""
                ) -> tuple[list[int], int | None, list[ImageRef] | None]:
    """``ids`` with the row's image placeholders expanded, ``start`` moved past them, and the images at their
    offsets (decoded only when their batch runs, so that a large file's pixels are never all in memory)."""
    if loaded.images is None or (not row.refs and loaded.images.reader.image_token_id not in ids):
        return ids, start, None
    sample = expand_ids(loaded, ids, row.refs or [], where)
    expanded = [int(t) for t in sample.tokens]
    return expanded, None if start is None else start + len(expanded) - len(ids), sample.images


def prompt_ids(loaded: LoadedModel, row: Row, chat: bool) -> list[int]:
    """The tokens a row's answer or choices follow."""
    if row.messages is not None or chat:
        return loaded.render_chat(row.messages or [{"role": "user", "content": row.prompt}])
    tok = loaded.tokenizer
    return tok.encode(row.prompt) or [tok.bos_id if tok.bos_id is not None else tok.eos_id]


def choice_requests(loaded: LoadedModel, row: Row, chat: bool, delimiter: str) -> list[tuple[list[int], int]]:
    """``(token ids, index of the first continuation token)`` for each choice of a multiple-choice row."""
    tok = loaded.tokenizer
    if chat:
        context_ids = prompt_ids(loaded, row, chat)
        return [(context_ids + tok.encode(choice), len(context_ids)) for choice in row.choices]
    context = row.prompt
    moved = context[len(context.rstrip()):]  # trailing whitespace belongs to the continuation
    context = context[: len(context) - len(moved)]
    context_ids = tok.encode(context)
    prefix = [] if context_ids else [tok.bos_id if tok.bos_id is not None else tok.eos_id]
    requests = []
    for choice in row.choices:
        whole = prefix + tok.encode(context + moved + delimiter + choice)
        requests.append((whole, len(prefix) + len(context_ids)))
    return requests


SCORED_TOKENS_PER_CHUNK = 256  # logits [chunk, vocab] at a time: 150 MB in fp32 at a 150k vocabulary


@torch.inference_mode()
def score_choices(model, requests: list[tuple[list[int], int]], batch_size: int,
                  advance=lambda items, tokens: None, images: list[list[ImageRef] | None] | None = None,
                  loaded: LoadedModel | None = None) -> list[float]:
    """The summed log-probability of each request's continuation, in request order; right-padded batches.

    A model that declares its output head (``ModelHooks.output_head``) is scored from its hidden states at the
    continuation positions only, a few hundred at a time: the [batch, length, vocabulary] logits of a whole batch
    (gigabytes at a 150k vocabulary) never exist. Other models give their full logits, as do requests with images
    (``images``: each request's images at their offsets, or None; ``loaded``: the model's preprocessing for them).
    """
    split = hooks_of(model).output_head
    if split is not None and not (images and any(images)):
        return _score_from_hidden(*split(model), model, requests, batch_size, advance)
    device = next(model.parameters()).device
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i][0]))
    scores = [0.0] * len(requests)
    for b in range(0, len(order), batch_size):
        batch = [requests[i] for i in order[b:b + batch_size]]
        tokens, positions = _right_padded(batch, device)
        extra = batch_images(loaded, images, order[b:b + batch_size], device) if images else None
        logits = model(tokens, positions, None, **(extra or {}))
        for r, (ids, start) in enumerate(batch):
            # The logits at position t predict token t + 1.
            logprobs = logits[r, start - 1:len(ids) - 1].float().log_softmax(-1)
            target = tokens[r, start:len(ids)]
            scores[order[b + r]] = logprobs.gather(-1, target[:, None]).sum().item()
        advance(len(batch), sum(len(ids) for ids, _ in batch))
    return scores


def _right_padded(batch: list[tuple[list[int], int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """The requests' ids right-padded with 0 to the longest ([B, T]) and their positions 0..T-1."""
    T = max(len(ids) for ids, _ in batch)
    tokens = torch.zeros(len(batch), T, dtype=torch.long)
    for r, (ids, _) in enumerate(batch):
        tokens[r, :len(ids)] = torch.tensor(ids)
    return tokens.to(device), torch.arange(T, device=device).expand(len(batch), T)


def _score_from_hidden(hidden, head: torch.Tensor, model, requests: list[tuple[list[int], int]], batch_size: int,
                       advance) -> list[float]:
    device = head.device
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i][0]))
    scores = [0.0] * len(requests)
    for b in range(0, len(order), batch_size):
        batch = [requests[i] for i in order[b:b + batch_size]]
        tokens, positions = _right_padded(batch, device)
        rows, cols, owner = [], [], []
        for r, (ids, start) in enumerate(batch):
            # The state at position t predicts token t + 1.
            rows += [r] * (len(ids) - start)
            cols += range(start - 1, len(ids) - 1)
            owner += [r] * (len(ids) - start)
        h = hidden(tokens, positions)
        rows_t, cols_t = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
        states, targets = h[rows_t, cols_t], tokens[rows_t, cols_t + 1]
        token_logps = torch.empty(len(rows), dtype=torch.float32, device=device)
        for s in range(0, len(rows), SCORED_TOKENS_PER_CHUNK):
            logits = torch.nn.functional.linear(states[s:s + SCORED_TOKENS_PER_CHUNK], head).float()
            picked = logits.gather(-1, targets[s:s + SCORED_TOKENS_PER_CHUNK, None])[:, 0]
            token_logps[s:s + SCORED_TOKENS_PER_CHUNK] = picked - logits.logsumexp(-1)
        sums = torch.zeros(len(batch), dtype=torch.float32, device=device).index_add_(
            0, torch.tensor(owner, device=device), token_logps)
        for r, total in enumerate(sums.tolist()):
            scores[order[b + r]] = total
        advance(len(batch), sum(len(ids) for ids, _ in batch))
    return scores


@torch.inference_mode()
def generate_answers(loaded: LoadedModel, prompts: list[list[int]], max_new_tokens: int, batch_size: int,
                     advance=lambda items, tokens: None, images: list[list[ImageRef] | None] | None = None
                     ) -> list[list[int]]:
    """Greedy continuations up to the first stop id, batched only among prompts of the same token length;
    ``images``: each prompt's images at their offsets (or None), given to the prefill step."""
    device = next(loaded.model.parameters()).device
    max_len = loaded.model.cfg.max_seq_len
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(prompts):
        by_length.setdefault(len(ids), []).append(i)
    answers: list[list[int]] = [[] for _ in prompts]
    for length, members in sorted(by_length.items()):
        for b in range(0, len(members), batch_size):
            group = members[b:b + batch_size]
            prompt = torch.tensor([prompts[i] for i in group], dtype=torch.long, device=device)
            extra = batch_images(loaded, images, group, device)
            out = generate(loaded.model, prompt, min(max_new_tokens, max_len - length), temperature=0.0,
                           stop_ids=loaded.stop_ids, inputs=extra)
            for r, i in enumerate(group):
                answers[i] = until_stop(out[r, length:].tolist(), loaded.stop_ids)
            advance(len(group), sum(len(answers[i]) for i in group))
    return answers


def batch_images(loaded: LoadedModel, images: list[list[ImageRef] | None] | None, members: list[int],
                 device: torch.device) -> dict | None:
    """The model's image inputs for a batch of ``members`` (rows without images give none), decoded now; None when
    none has any."""
    if images is None or all(not images[i] for i in members):
        return None
    return model_inputs(loaded.model, collate([pixel_inputs(loaded, images[i] or []) for i in members]), device)


def run_eval_lm(model_path: str | Path, cfg: EvalLMConfig) -> dict:
    """Score the model on ``cfg.data``; print the metrics with 95% Wilson intervals; return (and write) the results.
    The output file is checked before the model is read and appears only once complete."""
    kind, rows = read_rows(cfg.data, cfg.kind, cfg.limit)  # malformed rows fail before the model is read
    with ExitStack() as stack:
        staged = None if cfg.output is None else stack.enter_context(
            staged_file(cfg.output, cfg.overwrite, [cfg.data, model_path]))
        results = _evaluate(model_path, cfg, kind, rows)
        if staged is not None:
            staged.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if cfg.output is not None:
        console.print(f"wrote {cfg.output}")
    return results


def _evaluate(model_path: str | Path, cfg: EvalLMConfig, kind: Kind, rows: list[Row]) -> dict:
    """Load the model, score ``rows`` and print the metrics; the results as they are written."""
    loaded = load_for_inference(model_path)
    read_row_images(loaded, rows, cfg.data)
    chat = cfg.chat if cfg.chat is not None else (kind == "exact_match" and loaded.chat_template is not None)
    if any(r.messages is not None for r in rows) and cfg.chat is False:
        raise ConfigError(f"{cfg.data}: rows with 'messages' need the chat template; drop --no-chat")
    max_len = loaded.model.cfg.max_seq_len
    start = time.perf_counter()
    with _Progress(kind) as progress:
        if kind == "exact_match":
            expanded = [with_images(loaded, r, prompt_ids(loaded, r, chat), where=f"{cfg.data}:{r.line}")
                        for r in rows]
            prompts, images = [ids for ids, _, _ in expanded], [i for _, _, i in expanded]
            _check_fits(cfg.data, rows, [len(p) + 1 for p in prompts], max_len)
            progress.total(len(rows))
            outputs = generate_answers(loaded, prompts, cfg.max_new_tokens, cfg.batch_size, progress.advance,
                                       images)
            items = _exact_match_items(loaded, rows, outputs, cfg.normalize)
            tokens = sum(len(o) for o in outputs)
        else:
            delimiter = "" if chat else cfg.delimiter
            per_row = [[with_images(loaded, r, ids, start, f"{cfg.data}:{r.line}")
                        for ids, start in choice_requests(loaded, r, chat, delimiter)] for r in rows]
            _check_fits(cfg.data, rows, [max(len(ids) for ids, _, _ in reqs) for reqs in per_row], max_len)
            requests = [(ids, start) for reqs in per_row for ids, start, _ in reqs]
            images = [i for reqs in per_row for _, _, i in reqs]
            progress.total(len(requests))
            scores = iter(score_choices(loaded.model, requests, cfg.batch_size, progress.advance, images, loaded))
            items = _choice_items(rows, [[next(scores) for _ in reqs] for reqs in per_row])
            tokens = sum(len(ids) for ids, _ in requests)
    seconds = time.perf_counter() - start
    metrics = {}
    for name in ("exact_match",) if kind == "exact_match" else ("acc", "acc_norm"):
        correct = sum(item[name] for item in items)
        low, high = wilson_interval(correct, len(items))
        metrics[name] = {"value": correct / len(items), "ci95": [low, high], "correct": correct}
        console.print(f"{name:12s} {correct / len(items):.4f}  (95% CI {low:.4f}–{high:.4f}, n={len(items)})")
    console.print(f"{tokens} tokens in {seconds:.1f} s: {tokens / max(seconds, 1e-9):.0f} tokens/s "
                  f"({'generated' if kind == 'exact_match' else 'scored'}), {loaded.source}")
    results = {"model": str(loaded.source), "data": str(cfg.data), "kind": kind, "chat": chat, "n": len(items),
               "metrics": metrics, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9),
               "items": items}
    return results


def _check_fits(path: Path, rows: list[Row], lengths: list[int], max_len: int) -> None:
    for row, n in zip(rows, lengths):
        if n > max_len:
            raise EvalDataError(f"{path}:{row.line}: needs {n} tokens, beyond the model's max_seq_len {max_len}")


def _exact_match_items(loaded: LoadedModel, rows: list[Row], outputs: list[list[int]], mode: str) -> list[dict]:
    items = []
    for row, ids in zip(rows, outputs):
        prediction = loaded.tokenizer.decode(ids)
        norm = normalize_answer(prediction, mode)
        correct = any(norm == normalize_answer(a, mode) for a in row.answers)
        items.append({"line": row.line, "prediction": prediction, "answers": row.answers, "exact_match": correct})
    return items


def _choice_items(rows: list[Row], scores: list[list[float]]) -> list[dict]:
    items = []
    for row, lls in zip(rows, scores):
        normed = [ll / len(c.encode("utf-8")) for ll, c in zip(lls, row.choices)]
        pred = max(range(len(lls)), key=lls.__getitem__)
        pred_norm = max(range(len(lls)), key=normed.__getitem__)
        items.append({"line": row.line, "label": row.label, "pred": pred, "pred_norm": pred_norm, "logprobs": lls,
                      "acc": pred == row.label, "acc_norm": pred_norm == row.label})
    return items


class _Progress:
    """A rich progress bar over items with the token rate, on a terminal's stderr; silent off a terminal."""

    def __init__(self, description: str):
        from rich.console import Console

        self.description = description
        self._console = Console(stderr=True)
        self._bar = None

    def __enter__(self) -> "_Progress":
        if self._console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=self._console)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=None, rate="")
            self._start, self._tokens = time.perf_counter(), 0
        return self

    def total(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, total=n)

    def advance(self, items: int, tokens: int) -> None:
        if self._bar is not None:
            self._tokens += tokens
            rate = self._tokens / max(time.perf_counter() - self._start, 1e-9)
            self._bar.update(self._task, advance=items, rate=f"{rate:,.0f} tokens/s")

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
