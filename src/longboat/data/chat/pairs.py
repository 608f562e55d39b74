"""Preference pairs: a prompt with a chosen and a rejected answer, read from files and tokenized for training.

A row holds ``prompt``, ``chosen`` and ``rejected`` as plain text (the prompt becomes one user turn, each answer one
assistant turn), or as conversations: a ``prompt`` list of messages and each answer a list holding one assistant
message, or no ``prompt`` and two whole conversations whose common prefix is the prompt (the implicit prompt). Every
pair is rendered with the chat template; only the answer's tokens (the final assistant turn and what the template
closes it with) are supervised. A pair too long for ``seq_len`` loses the start of its prompt, never part of an
answer; one whose answers alone do not fit is dropped and counted.

Tokenized pairs lay out as two consecutive samples, chosen then rejected, packed whole into rows (``pack_pairs``):
the decoder's segment ids keep each answer attending to its own prompt, so a pair costs one forward pass.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from longboat.data.chat.packing import ChatRows, best_fit_decreasing
from longboat.data.chat.sources import (
    Malformed, Message, SourceReport, check_source, normalise_messages, row_tools, source_rows,
)
from longboat.data.chat.supervision import ChatSupervisor, Sample
from longboat.data.labels import IGNORE_INDEX


@dataclass
class Pair:
    prompt: list[Message]  # ends before the answers (the generation prompt opens them)
    chosen: Message  # one assistant message
    rejected: Message
    row: int
    tools: list[dict] | None = None


def read_pairs(path: str | Path, split: str | None = None) -> tuple[list[Pair], SourceReport]:
    """Every well-formed pair of one source, and the report of the rows skipped (by reason, with row numbers)."""
    check_source(path, split)
    report = SourceReport(str(path))
    pairs = []
    for row, raw in source_rows(Path(path), split, report):
        report.rows += 1
        try:
            pairs.append(normalise_pair(raw, row))
        except Malformed as e:
            report.count(row, e.reason, raw, e.detail)
    return pairs, report


def normalise_pair(raw: Any, row: int = 0) -> Pair:
    """A row as a :class:`Pair`, or :class:`Malformed` naming what is wrong."""
    if not isinstance(raw, dict):
        raise Malformed("not an object", type(raw).__name__)
    missing = [k for k in ("chosen", "rejected") if raw.get(k) is None]
    if missing:
        raise Malformed("missing fields", f"no {' or '.join(map(repr, missing))}; a pair needs chosen and rejected")
    prompt, chosen, rejected = raw.get("prompt"), raw["chosen"], raw["rejected"]
    if isinstance(chosen, str) or isinstance(rejected, str):
        if not (isinstance(chosen, str) and isinstance(rejected, str) and isinstance(prompt, str)):
            raise Malformed("mixed formats", "plain-text pairs need prompt, chosen and rejected all strings")
        pair = Pair([{"role": "user", "content": prompt}], _answer(chosen), _answer(rejected), row)
    else:
        chosen_turns, rejected_turns = normalise_messages(chosen), normalise_messages(rejected)
        if prompt is None:  # the implicit prompt: the common prefix of two whole conversations
            shared = 0
            while (shared < min(len(chosen_turns), len(rejected_turns)) - 1
                   and chosen_turns[shared] == rejected_turns[shared]):
                shared += 1
            prompt_turns, chosen_turns, rejected_turns = (chosen_turns[:shared], chosen_turns[shared:],
                                                          rejected_turns[shared:])
        else:
            prompt_turns = normalise_messages(prompt) if not isinstance(prompt, str) else [
                {"role": "user", "content": prompt}]
        for name, turns in (("chosen", chosen_turns), ("rejected", rejected_turns)):
            if len(turns) != 1 or turns[0]["role"] != "assistant":
                raise Malformed("answer not one assistant turn",
                                f"{name} holds {[t['role'] for t in turns]} after the prompt")
        if not prompt_turns:
            raise Malformed("empty prompt")
        pair = Pair(prompt_turns, chosen_turns[0], rejected_turns[0], row, row_tools(raw))
    if pair.chosen == pair.rejected:
        raise Malformed("identical answers", "chosen and rejected are the same; the pair teaches nothing")
    return pair


def _answer(text: str) -> Message:
    return {"role": "assistant", "content": text}


@dataclass
class EncodedPair:
    chosen: Sample
    rejected: Sample
    prompt_tokens: int  # the shortest of the two prompts, in tokens (their common part up to boundary merges)

    def __len__(self) -> int:
        return len(self.chosen) + len(self.rejected)


def encode_pairs(supervisor: ChatSupervisor, pairs: Sequence[Pair], source: str = "") -> tuple[
        list[EncodedPair | None], dict[int, str]]:
    """Each pair's two samples (None where the template refuses it), and the refusals by pair index.

    The supervisor's ``train_on`` applies to the answer only: earlier assistant turns of the prompt are context.
    """
    from longboat.data.chat.sources import Conversation

    conversations = [Conversation([*p.prompt, answer], p.row, p.tools) for p in pairs for answer in (p.chosen,
                                                                                                     p.rejected)]
    encoded, stats = supervisor.encode_final_turns(conversations, source)
    out: list[EncodedPair | None] = []
    refused: dict[int, str] = {}
    for i in range(len(pairs)):
        reasons = [stats.rejected[j] for j in (2 * i, 2 * i + 1) if j in stats.rejected]
        if reasons:
            refused[i] = reasons[0]
            out.append(None)
            continue
        chosen, rejected = encoded[2 * i][0], encoded[2 * i + 1][0]
        out.append(EncodedPair(chosen, rejected, min(_prompt_length(chosen), _prompt_length(rejected))))
    return out, refused


def _prompt_length(sample: Sample) -> int:
    """Tokens before the first supervised label (labels are shifted: the prompt's last token predicts the answer)."""
    return int(np.argmax(sample.labels != IGNORE_INDEX))


def fit_pair(pair: EncodedPair, seq_len: int, counts: Counter) -> EncodedPair | None:
    """The pair within ``seq_len`` tokens: the start of both prompts cut alike (their ends, which the answers follow,
    are kept), else None when the answers alone do not fit (counted)."""
    excess = len(pair) - seq_len
    if excess <= 0:
        return pair
    cut = (excess + 1) // 2
    if cut > pair.prompt_tokens - 1:  # keep at least the prompt's last token, which predicts the answer's first
        counts["dropped (answers longer than seq_len)"] += 1
        return None
    counts["prompt truncated"] += 1
    return EncodedPair(Sample(pair.chosen.tokens[cut:], pair.chosen.labels[cut:]),
                       Sample(pair.rejected.tokens[cut:], pair.rejected.labels[cut:]), pair.prompt_tokens - cut)


class PairRows(ChatRows):
    """Rows of whole pairs: segment ``2k − 1`` is a pair's chosen answer and ``2k`` its rejected one. Each row also
    carries ``pair_ids`` [T]: the index of the pair every token belongs to (−1 on padding), by which a precomputed
    reference log-probability is found."""

    def __init__(self, pairs: Sequence[EncodedPair], rows: list[list[int]], seq_len: int, pad_id: int,
                 pair_offset: int = 0):
        samples = [s for p in pairs for s in (p.chosen, p.rejected)]
        super().__init__(samples, [[2 * i + k for i in row for k in (0, 1)] for row in rows], seq_len, pad_id)
        self.n_pairs, self.pair_offset = len(pairs), pair_offset

    def __getitem__(self, r: int) -> dict[str, torch.Tensor]:
        item = super().__getitem__(r)
        pair_ids = np.full(self.seq_len, -1, dtype=np.int64)
        at = 0
        for i in self.row_samples[self.row_starts[r]:self.row_starts[r + 1]]:
            n = self.starts[i + 1] - self.starts[i]
            pair_ids[at:at + n] = self.pair_offset + i // 2
            at += n
        item["pair_ids"] = torch.from_numpy(pair_ids)
        return item


def pack_pairs(pairs: Sequence[EncodedPair], seq_len: int, pad_id: int, packing: bool = True,
               pair_offset: int = 0) -> PairRows:
    """Whole pairs packed into as few rows as best-fit decreasing finds (``packing=False``: one pair per row); pair
    ids start at ``pair_offset`` (validation pairs follow the training pairs in one reference table)."""
    if any(len(p) > seq_len for p in pairs):
        raise ValueError(f"every pair must hold at most {seq_len} tokens")
    rows = best_fit_decreasing([len(p) for p in pairs], seq_len) if packing else [[i] for i in range(len(pairs))]
    return PairRows(pairs, rows, seq_len, pad_id, pair_offset)
