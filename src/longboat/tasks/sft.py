"""Supervised fine-tuning on conversations: chat-template rendering, assistant-only labels, packed rows.

Sources are read, normalised and checked for malformed rows; each conversation is rendered with the chat template
and tokenized with labels on the assistant turns (``data/chat/supervision.py``); samples longer than ``seq_len``
are dropped or truncated; the rest are packed into rows (or padded one per row) once, and read in epochs.
For a model that reads images (``models.contracts.image_reader``), conversations carry images: each placeholder
becomes the image's tokens, truncation never cuts through an image, and rows carry their images' pixels and slots
(``data/chat/images.py``).

Mixing: a source of ``n`` conversations with ``weight: w`` contributes ``round(w * n)`` of them to the training
set: ``w >= 1`` repeats every conversation ``floor(w)`` times and draws the remainder without replacement,
``w < 1`` draws a subset, both seeded by the run's seed. The draw is made once per run (the rows are packed
once) and every epoch reads those rows in a fresh order. ``valid_fraction`` holds out that fraction of each
source's conversations (seeded, before weighting); ``valid_sources`` are held out whole (their weights unused).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from longboat.config.base import ConfigError, StrictModel
from longboat.data.chat.builtin import resolve_chat_template
from longboat.data.chat.images import expand_images, image_rows, read_image_conversations
from longboat.data.chat.cache import EncodeSettings, encoded_source
from longboat.data.chat.packing import ChatRows, MappedArrays, MappedRows, mapped_rows, pack, pad
from longboat.data.chat.sources import Format, check_malformed, check_source, read_conversations
from longboat.data.chat.supervision import ChatSupervisor, Sample, fit_samples
from longboat.data.tokenizer import CHAT_TEMPLATE_FILE, CONFIG_FILE, Tokenizer
from longboat.models.contracts import image_reader, require_language_model
from longboat.models.registry import hooks_for_config
from longboat.tasks.base import Task, TaskData, register_task
from longboat.tasks.lm_loss import make_lm_loss
from longboat.tasks.pretrain import tokenizer_assets, tokenizer_fitting
from longboat.utils.logging import console


class ChatSource(StrictModel):
    path: str = Field(description="jsonl, json, parquet, or a datasets save_to_disk directory")
    weight: float = Field(default=1.0, gt=0, description="share: round(weight * conversations) per epoch")
    format: Format = "auto"
    split: str | None = Field(default=None, description="the split of a DatasetDict directory")


class SFTDataConfig(StrictModel):
    tokenizer: str = Field(description="HF tokenizer directory (tokenizer.json)")
    chat_template: str | None = Field(default=None, description="null: the tokenizer's; a built-in name; a .jinja")
    template_kwargs: dict = Field(default_factory=dict, description="extra template variables (enable_thinking)")
    sources: list[ChatSource] = Field(min_length=1)
    valid_sources: list[ChatSource] = Field(default_factory=list)
    valid_fraction: float = Field(default=0.0, ge=0, lt=1)
    seq_len: int = Field(gt=0)
    packing: bool = True
    train_on: Literal["assistant", "all"] = "assistant"
    loss_normalization: Literal["tokens", "samples"] = "tokens"
    truncation: Literal["drop", "truncate"] = "drop"
    history_rewrite: Literal["per_turn", "error"] = "per_turn"
    max_malformed_fraction: float = Field(default=0.01, ge=0, le=1)
    cache: bool = Field(default=True, description="encode each source once into cache_dir and memory-map it "
                                                  "(a model that reads images always encodes in memory)")
    cache_dir: str | None = Field(default=None, description="where encoded sources live (default: .cache beside "
                                                            "the first source)")
    workers: int = Field(default=2, ge=1, description="processes that encode a source into the cache")
    image_token: str = Field(default="<image>", description="an image's placeholder in the text (a model that reads "
                                                            "images): one token of the tokenizer, its image_token_id")

    @field_validator("sources", "valid_sources", mode="before")
    @classmethod
    def _plain_sources(cls, v):
        return plain_sources(v)


def plain_sources(v):
    """Sources given as ``[path, ...]`` or a single path, besides mappings, as mappings."""
    if isinstance(v, str):
        v = [v]
    return [{"path": x} if isinstance(x, str) else x for x in v] if isinstance(v, list) else v


@register_task("sft")
class SFT(Task):
    """Fine-tuning on chat conversations, supervising the assistant's turns."""

    data_config = SFTDataConfig
    unit = "tokens"
    epochs = True

    def __init__(self, data: SFTDataConfig):
        super().__init__(data)
        self._fingerprint: torch.Tensor | None = None  # of the training rows, kept in checkpoints
        self._image_flops = 0.0  # per token, from the share of image tokens in the training rows

    def check(self, model_cfg) -> None:
        data: SFTDataConfig = self.data
        tokenizer = tokenizer_fitting(data.tokenizer, data.seq_len, require_language_model(model_cfg, "sft"))
        if _pad_id(tokenizer) is None:
            raise ConfigError(f"data.tokenizer: {data.tokenizer} names neither a pad nor an eos token to pad rows with")
        resolve_chat_template(tokenizer, data.chat_template)
        images = image_reader(model_cfg)
        if images is not None and tokenizer.encode(data.image_token) != [images.image_token_id]:
            raise ConfigError(f"data.image_token: {data.image_token!r} is not the single token model.image_token_id="
                              f"{images.image_token_id} in {data.tokenizer} (it encodes to "
                              f"{tokenizer.encode(data.image_token)})")
        for key, sources in (("sources", data.sources), ("valid_sources", data.valid_sources)):
            for i, s in enumerate(sources):
                try:
                    check_source(s.path, s.split)
                except ValueError as e:
                    raise ConfigError(f"data.{key}[{i}]: {e}") from None

    def build(self, model_cfg, train_cfg, seed: int, dp_size: int) -> TaskData:
        data: SFTDataConfig = self.data
        tokenizer = Tokenizer(data.tokenizer)
        counts: Counter = Counter()  # over each source's conversations once, before weighting
        images = image_reader(model_cfg)  # None for a model that reads no images
        if data.cache and images is None:
            train_rows, valid_rows, n_train, encoded = self._cached_rows(seed, counts, _pad_id(tokenizer))
        else:
            train_rows, valid_rows, n_train, encoded = self._rows_in_memory(tokenizer, images, seed, counts)
        if valid_rows is not None and len(valid_rows) < train_cfg.micro_batch_size * dp_size:
            raise ConfigError(f"data: the validation split fills {len(valid_rows)} rows, fewer than one micro-batch "
                              f"on every rank ({train_cfg.micro_batch_size} × {dp_size}); hold out more or drop it")
        self._fingerprint = _fingerprint(train_rows)
        if images is not None:  # what the tower adds to a token's FLOPs, on average over the training tokens
            share = float((train_rows.tokens == images.image_token_id).mean())
            self._image_flops = share * images.flops_per_image_token
        summary = {"train_samples": n_train, "train_rows": len(train_rows),
                   "packing": f"{train_rows.efficiency:.1%} tokens" if data.packing else "off",
                   "valid_rows": len(valid_rows) if valid_rows is not None else 0,
                   **{name: n for name, n in counts.items() if n}, **encoded}
        return TaskData(train_rows, valid_rows,
                        make_lm_loss(True, True, per_sample=data.loss_normalization == "samples",
                                     extra_inputs=hooks_for_config(model_cfg).model_inputs), summary)

    def _rows_in_memory(self, tokenizer: Tokenizer, images, seed: int, counts: Counter):
        """Every source read, encoded and fitted in this process, the samples held in memory (and their images)."""
        data: SFTDataConfig = self.data
        template, _ = resolve_chat_template(tokenizer, data.chat_template)
        supervisor = ChatSupervisor(tokenizer, template, data.template_kwargs, data.train_on, data.history_rewrite)
        train: list[Sample] = []
        valid: list[Sample] = []
        encoding_s, n_conversations = 0.0, 0
        for k, source in enumerate(data.sources + data.valid_sources):
            if images is None:
                conversations, report = read_conversations(source.path, source.format, source.split)
            else:
                conversations, report = read_image_conversations(source.path, images.processor, data.image_token,
                                                                 source.format, source.split)
            check_malformed(report, data.max_malformed_fraction)
            started = time.perf_counter()
            encoded, stats = supervisor.encode(conversations, source.path)
            if images is not None:
                encoded = [[expand_images(s, c.images, images.image_token_id) for s in samples]
                           for c, samples in zip(conversations, encoded)]
            encoding_s += time.perf_counter() - started
            n_conversations += len(conversations)
            for i, why in stats.rejected.items():
                report.count(conversations[i].row, "rejected by template", conversations[i].messages, why)
            check_malformed(report, data.max_malformed_fraction)
            counts["boundary merges"] += stats.boundary_merges
            _print_source(source.path, report, stats.per_turn)
            fitted = {i: self._fit(encoded[i], counts) for i in range(len(conversations)) if i not in stats.rejected}
            kept = list(fitted)
            if k >= len(data.sources):  # a validation source
                valid += [s for i in kept for s in fitted[i]]
                continue
            rng = np.random.default_rng([seed, k])
            order = rng.permutation(len(kept))
            n_valid = round(data.valid_fraction * len(kept))
            valid += [s for j in sorted(order[:n_valid]) for s in fitted[kept[j]]]
            chosen = _weighted([kept[j] for j in sorted(order[n_valid:])], source.weight, rng, source.path)
            train += [s for i in chosen for s in fitted[i]]
        self._check_some(len(train), counts)
        layout = pack if data.packing else pad
        if images is not None:
            layout = functools.partial(image_rows, processor=images.processor, packing=data.packing)
        pad_id = _pad_id(tokenizer)
        valid_rows = layout(valid, data.seq_len, pad_id) if valid else None
        return (layout(train, data.seq_len, pad_id), valid_rows, len(train),
                {"tokenized": f"{n_conversations / max(encoding_s, 1e-9):.0f} conversations/s"})

    def _cached_rows(self, seed: int, counts: Counter, pad_id: int):
        """Every source's samples from its cache (encoded there first by ``data.workers`` processes when absent),
        chosen as :meth:`_rows_in_memory` chooses them, laid out from their lengths and read by memory map."""
        data: SFTDataConfig = self.data
        settings = EncodeSettings(data.tokenizer, data.chat_template, data.template_kwargs, data.train_on,
                                  data.history_rewrite, data.seq_len, data.truncation)
        cache_dir = sft_cache_dir(data)
        stores, train, valid, built, built_s, conversations = [], [], [], 0, 0.0, 0
        for k, source in enumerate(data.sources + data.valid_sources):
            enc = encoded_source(source.path, source.format, source.split, settings, cache_dir, data.workers)
            check_malformed(enc.read_report, data.max_malformed_fraction)
            check_malformed(enc.report, data.max_malformed_fraction)
            counts.update(enc.counts)
            _print_source(source.path, enc.report, enc.per_turn)
            stores.append(MappedArrays(enc.tokens, enc.labels, enc.starts))
            if enc.built_s is not None:
                built, built_s, conversations = built + 1, built_s + enc.built_s, conversations + enc.conversations
            kept = np.arange(enc.conversations)
            if k >= len(data.sources):  # a validation source
                valid.append((k, _samples_of(enc.kept, kept)))
                continue
            rng = np.random.default_rng([seed, k])
            order = rng.permutation(len(kept))
            n_valid = round(data.valid_fraction * len(kept))
            valid.append((k, _samples_of(enc.kept, np.sort(order[:n_valid]))))
            chosen = _weighted_array(np.sort(order[n_valid:]), source.weight, rng, source.path)
            train.append((k, _samples_of(enc.kept, chosen)))
        store, index = _concat(train)
        self._check_some(len(index), counts)
        valid_store, valid_index = _concat(valid)
        valid_rows = (mapped_rows(stores, valid_store, valid_index, data.seq_len, pad_id, data.packing)
                      if len(valid_index) else None)
        encoded = {"cache": f"{cache_dir}: {len(stores) - built} read"
                            + (f", {built} encoded ({conversations / max(built_s, 1e-9):.0f} conversations/s)"
                               if built else "")}
        return (mapped_rows(stores, store, index, data.seq_len, pad_id, data.packing), valid_rows, len(index),
                encoded)

    def _check_some(self, n_train: int, counts: Counter) -> None:
        if not n_train:
            raise ConfigError(f"data: no training sample fits data.seq_len={self.data.seq_len} "
                              f"({counts['dropped (too long)']} dropped as too long, "
                              f"{counts['no supervised token']} with no supervised token)")

    def _fit(self, samples: list[Sample], counts: Counter) -> list[Sample]:
        """The samples fitted to ``seq_len`` (dropped or truncated) that still supervise a token."""
        return fit_samples(samples, self.data.seq_len, self.data.truncation == "truncate", counts)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rows_fingerprint": self._fingerprint} if self._fingerprint is not None else {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Resuming reads the rows from where the checkpoint left off, by count: say so when they changed."""
        saved = state.get("rows_fingerprint")
        if saved is not None and self._fingerprint is not None and not torch.equal(saved, self._fingerprint):
            console.print("[yellow]warning:[/] the training rows differ from those the checkpoint was trained on "
                          "(sources, tokenizer, template or data options changed); training goes on from the "
                          "checkpoint's position in the new rows")

    def flops_per_unit(self, model_cfg) -> float | None:
        return float(require_language_model(model_cfg, "sft").flops_per_token(self.data.seq_len)) + self._image_flops

    def eval_metrics(self, loss: float, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), **metrics}

    def export_assets(self) -> dict[str, Path | bytes]:
        """The tokenizer files and, when the template is not the tokenizer's own, that template as
        ``chat_template.jinja`` (with the tokenizer config's own template removed, so loaders find only ours)."""
        assets = tokenizer_assets(self.data.tokenizer)
        if self.data.chat_template is None:
            return assets
        template, _ = resolve_chat_template(Tokenizer(self.data.tokenizer), self.data.chat_template)
        assets[CHAT_TEMPLATE_FILE] = template.source.encode("utf-8")
        config_file = Path(self.data.tokenizer) / CONFIG_FILE
        if config_file.is_file():
            config = json.loads(config_file.read_text("utf-8"))
            config.pop("chat_template", None)
            assets[CONFIG_FILE] = (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        return assets


def _weighted(indices: list[int], weight: float, rng: np.random.Generator, path: str) -> list[int]:
    """``round(weight * len(indices))`` of ``indices``: whole repeats, then a draw without replacement."""
    target = round(weight * len(indices))
    if indices and target == 0:
        raise ConfigError(f"data.sources: {path}: weight {weight} keeps none of its {len(indices)} conversations")
    repeats, rest = divmod(target, len(indices)) if indices else (0, 0)
    return indices * repeats + sorted(indices[j] for j in rng.permutation(len(indices))[:rest])


def _weighted_array(indices: np.ndarray, weight: float, rng: np.random.Generator, path: str) -> np.ndarray:
    """:func:`_weighted` on an array: the same draw from the same generator."""
    target = round(weight * len(indices))
    if len(indices) and target == 0:
        raise ConfigError(f"data.sources: {path}: weight {weight} keeps none of its {len(indices)} conversations")
    repeats, rest = divmod(target, len(indices)) if len(indices) else (0, 0)
    return np.concatenate([np.tile(indices, repeats), np.sort(indices[rng.permutation(len(indices))[:rest]])])


def _samples_of(kept: np.ndarray, conversations: np.ndarray) -> np.ndarray:
    """The samples of the given kept conversations, in order (``kept[j]:kept[j + 1]`` are conversation j's)."""
    conversations = np.asarray(conversations, dtype=np.int64)
    first, n = kept[conversations], kept[conversations + 1] - kept[conversations]
    return np.repeat(first - np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64), n) + np.arange(n.sum())


def _concat(parts: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """``(store, index)`` of the samples of every ``(store, sample indices)`` part, in order."""
    store = np.concatenate([np.zeros(0, np.int64), *[np.full(len(ix), k, dtype=np.int64) for k, ix in parts]])
    return store, np.concatenate([np.zeros(0, np.int64), *[ix for _, ix in parts]]).astype(np.int64)


def sft_cache_dir(data: SFTDataConfig) -> str:
    """``data.cache_dir``, or ``.cache`` beside the first source."""
    return data.cache_dir or str(Path(data.sources[0].path).resolve().parent / ".cache")


def _print_source(path: str, report, per_turn: int) -> None:
    console.print(f"{path}: {report.rows - report.n_malformed} conversations"
                  + (f" · malformed {report.describe()}" if report.n_malformed else "")
                  + (f" · {per_turn} split per turn (history rewrite)" if per_turn else ""))


def _fingerprint(rows: ChatRows | MappedRows) -> torch.Tensor:
    digest = hashlib.blake2b(digest_size=8)
    for array in rows.fingerprint_arrays():
        digest.update(np.ascontiguousarray(array).tobytes())
    return torch.from_numpy(np.frombuffer(digest.digest(), dtype=np.int64).copy())


def _pad_id(tokenizer: Tokenizer) -> int | None:
    return tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eos_id
