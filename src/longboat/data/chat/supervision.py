"""Token ids and labels of conversations, correct to the token.

The ids of a conversation are its full rendering tokenized without added special tokens, exactly what
``apply_chat_template(..., tokenize=True)`` returns. An assistant turn supervises what the template adds when the
conversation through that turn is rendered, beyond the conversation before it rendered with the generation prompt:
the turn's text and whatever the template closes it with (its end-of-turn token), never the prompt the model is
given. The spans come from the renderings (each prefix rendering is a string prefix of the full one), mapped to
tokens with the tokenizer's character offsets; each prefix rendering is then tokenized too, to verify that its
ids are a prefix of the full ids (from its last added token on: added tokens split a text into pieces that
tokenize independently, so only the piece a prefix ends in can differ).

Where a BPE merge straddles a boundary (e.g. a turn that opens with a newline merging with the newline that ends
the generation prompt) the prefix's ids are not a prefix of the full ids. The full ids stay as they are (they are
what the template tokenizes to), and every token holding any character of a supervised span is supervised. Such
boundaries are counted and reported.

Templates that rewrite history (e.g. dropping ``<think>`` blocks from earlier assistant turns) render a turn one way
while it is the last and another way once later turns follow: the rendering through a turn is then not a prefix of
the full one. ``history_rewrite: per_turn`` makes one sample per assistant turn (the conversation through that
turn, only that turn supervised); ``error`` refuses the conversation.
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np

from longboat.data.chat.sources import Conversation, Message
from longboat.data.chat.template import ChatTemplate, ChatTemplateError
from longboat.data.labels import IGNORE_INDEX
from longboat.data.tokenizer import Tokenizer

TrainOn = Literal["assistant", "all"]
HistoryRewrite = Literal["per_turn", "error"]
_CHUNK = 512  # conversations encoded per batch: bounds the memory held by the backend's encodings


@dataclass
class Sample:
    """One training sequence: ``tokens`` and pre-shifted ``labels`` (``labels[t]`` is the target of ``tokens[t]``)."""

    tokens: np.ndarray  # int32 [L]
    labels: np.ndarray  # int32 [L], IGNORE_INDEX where unsupervised
    images: list = field(default_factory=list)  # images whose tokens it holds, each with its ``offset``

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, n: int) -> Sample | None:
        """The first ``n`` tokens with the images wholly inside them; None when the cut goes through an image."""
        if any(image.offset < n < image.offset + image.tokens for image in self.images):
            return None
        return Sample(self.tokens[:n], self.labels[:n], [image for image in self.images if image.offset < n])


@dataclass
class SupervisionStats:
    conversations: int = 0
    per_turn: int = 0  # conversations split into one sample per turn (history-rewriting template)
    boundary_merges: int = 0  # prefix renderings whose ids are not a prefix of the full ids
    rejected: dict[int, str] = field(default_factory=dict)  # conversation index -> the template's refusal


@dataclass
class _Plan:
    """One sample to tokenize: its text, its supervised character spans, and the prefixes to verify."""

    conversation: int
    text: str
    spans: list[tuple[int, int]]
    prefixes: list[str]


def fit_samples(samples: Sequence[Sample], seq_len: int, truncate: bool, counts: Counter) -> list[Sample]:
    """The samples fitted to ``seq_len`` (dropped, or cut when ``truncate``) that still supervise a token; what was
    dropped or cut is counted in ``counts``."""
    out = []
    for s in samples:
        if len(s) > seq_len:
            if not truncate:
                counts["dropped (too long)"] += 1
                continue
            s = s.truncated(seq_len)
            if s is None:
                counts["dropped (truncation through an image)"] += 1
                continue
            counts["truncated"] += 1
        if not (s.labels >= 0).any():
            counts["no supervised token"] += 1
            continue
        out.append(s)
    return out


class SupervisionError(ChatTemplateError):
    """A template rewrites earlier turns and ``history_rewrite: error`` refuses it."""


class ChatSupervisor:
    """Turns conversations into :class:`Sample`\\ s with a template, a tokenizer and a supervision policy."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate, template_kwargs: dict | None = None,
                 train_on: TrainOn = "assistant", history_rewrite: HistoryRewrite = "per_turn"):
        self.tokenizer, self.template = tokenizer, template
        self.kwargs = dict(template_kwargs or {})
        self.train_on, self.history_rewrite = train_on, history_rewrite

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False,
               tools: list[dict] | None = None) -> str:
        """The template's text; a conversation's own ``tools`` take the place of ``template_kwargs``' tools."""
        kwargs = {**self.kwargs, "tools": tools} if tools else self.kwargs
        return self.template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)

    def encode(self, conversations: Sequence[Conversation], source: str = "") -> tuple[list[list[Sample]],
                                                                                      SupervisionStats]:
        """The samples of each conversation (empty for one the template refuses), and what was found."""
        return self._encode(conversations, source, self._plan)

    def encode_final_turns(self, conversations: Sequence[Conversation], source: str = "") -> tuple[
            list[list[Sample]], SupervisionStats]:
        """One sample per conversation supervising its final turn alone (an answer to the turns before it, e.g. one
        side of a preference pair); empty for one the template refuses."""
        return self._encode(conversations, source, self._final_plan)

    def _encode(self, conversations: Sequence[Conversation], source: str, planner) -> tuple[list[list[Sample]],
                                                                                          SupervisionStats]:
        stats = SupervisionStats(conversations=len(conversations))
        out: list[list[Sample]] = [[] for _ in conversations]
        for start in range(0, len(conversations), _CHUNK):
            plans = []
            for i in range(start, min(start + _CHUNK, len(conversations))):
                try:
                    plans += planner(i, conversations[i], stats)
                except SupervisionError as e:
                    raise SupervisionError(f"{source}: row {conversations[i].row}: {e}") from None
                except (ChatTemplateError, TypeError) as e:  # a TypeError: e.g. the template adds a str and a list
                    stats.rejected[i] = str(e)
            for plan, sample in zip(plans, self._tokenize(plans, stats)):
                out[plan.conversation].append(sample)
        return out, stats

    def _final_plan(self, index: int, conversation: Conversation, stats: SupervisionStats) -> list[_Plan]:
        render = functools.partial(self.render, tools=conversation.tools)
        before, through = render(conversation.messages[:-1], add_generation_prompt=True), render(conversation.messages)
        if not through.startswith(before):
            raise ChatTemplateError(f"the generation prompt does not open the final turn as the template renders it "
                                    f"(the prompt ends {before[-40:]!r}), so the prompt cannot be told from the answer")
        return [_Plan(index, through, [(len(before), len(through))], [before])]

    def _plan(self, index: int, conversation: Conversation, stats: SupervisionStats) -> list[_Plan]:
        messages = conversation.messages
        render = functools.partial(self.render, tools=conversation.tools)
        full = render(messages)
        if self.train_on == "all":
            return [_Plan(index, full, [(0, len(full))], [])]
        turns = []  # (rendering before the turn with the generation prompt, rendering through the turn)
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before, through = render(messages[:i], add_generation_prompt=True), render(messages[: i + 1])
            if not through.startswith(before):  # e.g. a reasoning turn where template_kwargs turn thinking off
                raise ChatTemplateError(
                    f"the generation prompt does not open assistant turn {i} as the template renders it (the prompt "
                    f"ends {before[-40:]!r}, the turn has {through[len(before) - 40:len(before)]!r} there), so the "
                    "prompt cannot be told from the reply"
                )
            turns.append((before, through))
        if all(full.startswith(through) for _, through in turns):
            spans = [(len(before), len(through)) for before, through in turns]
            prefixes = [p for turn in turns for p in turn if len(p) < len(full)]
            return [_Plan(index, full, spans, prefixes)]
        if self.history_rewrite == "error":
            raise SupervisionError(
                "the chat template rewrites earlier turns (the rendering through an assistant turn is not a prefix "
                "of the whole conversation's, e.g. reasoning dropped from history); set data.history_rewrite: "
                "per_turn to train one sample per assistant turn"
            )
        stats.per_turn += 1
        return [_Plan(index, through, [(len(before), len(through))], [before]) for before, through in turns]

    def _tokenize(self, plans: list[_Plan], stats: SupervisionStats) -> list[Sample]:
        encodings = self.tokenizer.backend.encode_batch([p.text for p in plans], add_special_tokens=False)
        ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
        offsets = [_Offsets(e) for e in encodings]  # read at the few tokens a bisection visits
        added = [np.flatnonzero(np.isin(ids[k], self._added)) if plan.prefixes else None
                 for k, plan in enumerate(plans)]
        checks = [(k, *_window(plan.text, offsets[k], added[k], len(prefix)))
                  for k, plan in enumerate(plans) for prefix in plan.prefixes]
        windows = self.tokenizer.encode_batch([text for _, text, _, _ in checks])
        for (k, _, first, last), got in zip(checks, windows):
            if last - first != len(got) or not np.array_equal(ids[k][first:last], got):
                stats.boundary_merges += 1
        samples = []
        for k, plan in enumerate(plans):
            labels = np.full(len(ids[k]), IGNORE_INDEX, dtype=np.int32)
            for a, b in plan.spans:  # every token holding a character of [a, b)
                first, last = _tokens_ending_by(offsets[k], a), _tokens_starting_before(offsets[k], b)
                labels[first:last] = ids[k][first:last]
            samples.append(Sample(ids[k][:-1], labels[1:]))
        return samples

    @functools.cached_property
    def _added(self) -> np.ndarray:
        return np.fromiter(self.tokenizer.backend.get_added_tokens_decoder(), dtype=np.int64)


class _Offsets:
    """An encoding's ``(start, end)`` character offsets by token, each asked of the encoding when read: a span's
    boundaries are found by bisection, which visits a few tokens, where ``Encoding.offsets`` builds them all."""

    def __init__(self, encoding):
        self.encoding, self.n = encoding, len(encoding)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, t: int) -> tuple[int, int]:
        if not 0 <= t < self.n:
            raise IndexError(t)
        return self.encoding.token_to_chars(t)


def _window(text: str, offsets: Sequence[tuple[int, int]], added: np.ndarray, end: int) -> tuple[str, int, int]:
    """``(text, first, last)``: the prefix ``text[:end]`` from its last added token on (``added``: the positions
    of added tokens), whose ids must equal the full ids ``[first:last]`` for the prefix's ids to be a prefix of them.

    Added (special) tokens split a text into pieces that tokenize independently, so only the piece the prefix ends
    in can differ; verifying from the last added token keeps the check short.
    """
    last = _tokens_ending_by(offsets, end)
    k = int(np.searchsorted(added, last)) - 1  # the last added token that ends by the prefix's end
    first = int(added[k]) if k >= 0 else 0
    return text[offsets[first][0] if k >= 0 else 0:end], first, last


def _tokens_ending_by(offsets: Sequence[tuple[int, int]], c: int) -> int:
    """How many tokens end at or before character ``c`` (offsets are ordered)."""
    return bisect.bisect_right(offsets, c, key=lambda o: o[1])


def _tokens_starting_before(offsets: Sequence[tuple[int, int]], c: int) -> int:
    return bisect.bisect_left(offsets, c, key=lambda o: o[0])
