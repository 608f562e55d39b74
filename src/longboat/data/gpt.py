"""GPT samples from a Megatron token file, built exactly as megatron-core 0.16.1's ``GPTDataset`` builds them.

Three indices define the samples: a document index (the split's documents repeated once per epoch and
shuffled), a sample index (where each sample starts: a position in the document index and a token offset)
and a shuffle index (the order samples are served in). They are cached as ``.npy`` files so a second run
starts at once. Given the same files, seed and sizes, sample ``i`` here is Megatron's sample ``i``.

Megatron splits and samples by *sequence* (an ``.idx`` entry); tokenizers write one sequence per document,
so "document" below means a sequence of the file.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from longboat.errors import LongboatError
from longboat.config.base import StrictModel
from longboat.data.index_cache import cache_key, cached_arrays
from longboat.data.indexed import IndexedDataset
from longboat.data.labels import IGNORE_INDEX
from longboat.data.split import SPLIT_NAMES, split_weights

# Megatron pads a short final sample with -1 (never a real token id) when the tokenizer has no pad token.
PAD_SENTINEL = -1
# The last epoch is shuffled on its own when it supplies fewer than this share of a full epoch's samples.
SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80
_CACHE_FORMAT = 1
_SAMPLE_INDEX_CHUNK = 1 << 22  # document-index entries per pass, bounds the temporary memory


class GPTDatasetError(LongboatError, ValueError):
    """The token data cannot give the samples that were asked for."""


class EmptySplitError(GPTDatasetError):
    """A split has no documents (or no tokens) but samples were requested from it."""


class DatasetTooSmallError(GPTDatasetError):
    """A split holds fewer tokens than one sample needs."""


class GPTDatasetConfig(StrictModel):
    """How samples are cut from token files; field names map to megatron-core's ``GPTDatasetConfig``."""

    seq_len: int = Field(gt=1, description="tokens per sample (Megatron: sequence_length)")
    seed: int = Field(ge=0, lt=2**32, description="seeds numpy.random.RandomState (Megatron: random_seed)")
    split: str = "969,30,1"
    eod_id: int = Field(description="end-of-document token (Megatron: tokenizer.eod)")
    pad_id: int | None = Field(None, description="its tokens are loss-masked (Megatron: tokenizer.pad)")
    reset_position_ids: bool = False
    reset_attention_mask: bool = Field(False, description="emit segments: attention stays within a document")
    eod_mask_loss: bool = Field(False, description="zero the loss where the input token is EOD")
    add_extra_token: bool = Field(True, description="draw seq_len + 1 tokens (Megatron: add_extra_token_to_sequence)")
    drop_last_partial_validation_sequence: bool = True
    blend_surplus: float = Field(0.005, ge=0, description="Megatron's mid_level_dataset_surplus")
    cache_dir: str | None = None

    @field_validator("split")
    @classmethod
    def _check_split(cls, value: str) -> str:
        split_weights(value)
        return value

    @model_validator(mode="after")
    def _check_pad(self) -> "GPTDatasetConfig":
        if self.pad_id is not None and self.pad_id == self.eod_id:
            raise ValueError(
                f"pad_id {self.pad_id} equals eod_id: Megatron ignores a pad id that collides with a special "
                "token (masking it would mask every EOD); leave pad_id unset"
            )
        return self


# ---------------------------------------------------------------------------------------------------------
# Index construction (pure functions of lengths, seeds and sizes)


def plan_epochs(tokens_per_epoch: int, num_samples: int | None, seq_len: int, extra: int) -> tuple[int, bool, int]:
    """(epochs, separate_final_epoch, samples before the final epoch) for a request of ``num_samples``."""
    if num_samples is None:
        return 1, False, 0
    # The fewest epochs whose tokens cover num_samples * seq_len (+ the one extra token).
    needed = num_samples * seq_len + extra
    num_epochs = max(1, -(-needed // tokens_per_epoch))
    if num_epochs == 1:
        return 1, False, 0
    samples_before_final = ((num_epochs - 1) * tokens_per_epoch - extra) // seq_len
    samples_per_epoch = (tokens_per_epoch - extra) // seq_len
    from_final = num_samples - samples_before_final
    # The last epoch is shuffled separately when it supplies < 80% of a full epoch's samples, so the full
    # epochs are served whole before any sample of the small last one (which would displace some of theirs).
    separate = from_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * samples_per_epoch)
    return num_epochs, separate, samples_before_final


def build_document_index(
    documents: np.ndarray, num_epochs: int, separate_final_epoch: bool, rng: np.random.RandomState
) -> np.ndarray:
    """The documents once per epoch, shuffled together (or the final epoch shuffled on its own)."""
    if separate_final_epoch and num_epochs > 1:
        first = build_document_index(documents, num_epochs - 1, False, rng)
        return np.concatenate((first, build_document_index(documents, 1, False, rng)))
    index = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
    rng.shuffle(index)
    return index


def build_sample_index(
    sequence_lengths: np.ndarray,
    document_index: np.ndarray,
    seq_len: int,
    num_epochs: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token: bool = True,
) -> np.ndarray:
    """``[num_samples + 1, 2]``: row ``k`` = (position in ``document_index``, token offset) where sample ``k``
    starts; sample ``k`` ends where sample ``k + 1`` starts (+ the extra token). Vectorised form of
    Megatron's C++ ``build_sample_idx``: sample ``k`` starts at token ``k * seq_len`` of the epochs' stream.
    """
    extra = int(add_extra_token)
    total = num_epochs * tokens_per_epoch
    if drop_last_partial_sequence:
        num_samples = (total - extra) // seq_len
    else:
        # Megatron rounds this count up in single precision (a C++ float); reproduce that exactly.
        num_samples = int(math.ceil(np.float32(total - extra) / np.float32(seq_len)))
    biggest = max(len(document_index), int(sequence_lengths.max()))
    out = np.empty((num_samples + 1, 2), np.int32 if biggest <= np.iinfo(np.int32).max else np.int64)
    out[0] = 0
    n_whole = min(num_samples, (total - extra) // seq_len)
    # Samples past the end of the data (a partial last validation sample) all point at the end of the
    # last document, minus the extra token, as Megatron records them.
    out[1 + n_whole :, 0] = len(document_index) - 1
    out[1 + n_whole :, 1] = int(sequence_lengths[document_index[-1]]) - extra
    # Sample k >= 1 starts at token k * seq_len of the stream. A document whose stream end is e has samples
    # 1..(e - extra) // seq_len starting before its end, so sample k starts in the first document where that
    # count reaches k. Subtracting `extra` also settles boundaries: with the extra token a sample starting on
    # a document boundary starts at the next document; without it Megatron keeps it at the end of the
    # previous one (offset == its length).
    done, base = 0, 0
    for lo in range(0, len(document_index), _SAMPLE_INDEX_CHUNK):
        if done == n_whole:
            break
        docs = document_index[lo : lo + _SAMPLE_INDEX_CHUNK]
        ends = np.cumsum(sequence_lengths[docs], dtype=np.int64)
        ends += base
        upto = ends - extra
        upto //= seq_len
        np.clip(upto, done, n_whole, out=upto)
        stop = int(upto[-1])
        # Sample k starts in the first document with upto >= k: at position #{documents with upto < k}.
        pos = np.cumsum(np.bincount(upto - done, minlength=stop - done + 1)[: stop - done])
        starts = np.arange(done + 1, stop + 1, dtype=np.int64)
        starts *= seq_len
        starts -= ends[pos]
        starts += sequence_lengths[docs[pos]]
        out[1 + done : 1 + stop, 0] = pos + lo
        out[1 + done : 1 + stop, 1] = starts
        done, base = stop, int(ends[-1])
    return out


def build_shuffle_index(num_first: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    """``[0, total)`` with ``[0, num_first)`` and ``[num_first, total)`` shuffled separately."""
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_first, dtype=dtype)
    rng.shuffle(first)
    if num_first == total:
        return first
    last = np.arange(num_first, total, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def _fingerprint(lengths: np.ndarray) -> str:
    """Content hash of the sequence lengths: the only property of a file the indices depend on."""
    return hashlib.blake2b(np.ascontiguousarray(lengths).data, digest_size=16).hexdigest()


# ---------------------------------------------------------------------------------------------------------
# Dataset


class GPTDataset(torch.utils.data.Dataset):
    """Fixed-length next-token samples over a set of documents of one token file.

    ``document_range`` is a ``(start, end)`` tuple of document ids or an array of ids. ``num_samples`` is the
    least number of samples wanted (whole epochs are built, so ``len`` may be larger); ``None`` = one epoch.
    ``split_name`` matters only for ``valid`` (``drop_last_partial_validation_sequence``).
    """

    def __init__(
        self,
        indexed: IndexedDataset,
        document_range: tuple[int, int] | Sequence[int] | np.ndarray,
        num_samples: int | None,
        config: GPTDatasetConfig,
        split_name: str = "train",
    ):
        if split_name not in SPLIT_NAMES:
            raise ValueError(f"split_name {split_name!r}: expected one of {', '.join(SPLIT_NAMES)}")
        if num_samples is not None and num_samples < 0:
            raise ValueError(f"num_samples must be >= 0 or None, got {num_samples}")
        self.indexed, self.config, self.split_name, self.num_samples = indexed, config, split_name, num_samples
        self.path = indexed.prefix
        lengths = indexed.sequence_lengths
        doc_ids, doc_key = _document_ids(document_range, len(indexed), self.path)
        tokens_per_epoch = int(lengths[doc_ids].sum(dtype=np.int64))

        want = "one epoch of samples" if num_samples is None else f"{num_samples} samples"
        if doc_ids.size == 0 or tokens_per_epoch == 0:
            what = "no documents" if doc_ids.size == 0 else f"{doc_ids.size} documents but no tokens"
            raise EmptySplitError(
                f"{split_name} split of {self.path} has {what}, but {want} were requested; give the split more "
                "weight in the split string (e.g. '969,30,1'), use a bigger file, or ask this split for no samples"
            )
        extra = int(config.add_extra_token)
        if tokens_per_epoch < config.seq_len + extra:
            raise DatasetTooSmallError(
                f"{split_name} split of {self.path} has {tokens_per_epoch} tokens, fewer than one sample needs "
                f"(seq_len {config.seq_len} + {extra}); lower seq_len, give the split more weight, or add data"
            )

        self.tokens_per_epoch = tokens_per_epoch
        self.num_epochs, self.separate_final_epoch, before_final = plan_epochs(
            tokens_per_epoch, num_samples, config.seq_len, extra
        )
        drop_last = split_name != "valid" or config.drop_last_partial_validation_sequence
        description = {
            "format": _CACHE_FORMAT,
            "sequence_lengths": _fingerprint(lengths),
            "documents": doc_key,
            "num_samples": num_samples,
            "seq_len": config.seq_len,
            "seed": config.seed,
            "add_extra_token": config.add_extra_token,
            "drop_last_partial_sequence": drop_last,
            "split": split_name,
        }
        self.cache_key = cache_key(description)

        def build() -> dict[str, np.ndarray]:
            rng = np.random.RandomState(config.seed)
            document_index = build_document_index(doc_ids, self.num_epochs, self.separate_final_epoch, rng)
            sample_index = build_sample_index(
                lengths, document_index, config.seq_len, self.num_epochs, tokens_per_epoch, drop_last, bool(extra)
            )
            n = len(sample_index) - 1
            shuffle_index = build_shuffle_index(before_final if self.separate_final_epoch else n, n, rng)
            return {"document_index": document_index, "sample_index": sample_index, "shuffle_index": shuffle_index}

        arrays, self.from_cache = cached_arrays(config.cache_dir, "gpt", description, build, {"path": str(self.path)})
        self.document_index = arrays["document_index"]
        self.sample_index = arrays["sample_index"]
        self.shuffle_index = arrays["shuffle_index"]
        self._pad = PAD_SENTINEL if config.pad_id is None else config.pad_id

    def __len__(self) -> int:
        return len(self.sample_index) - 1

    def tokens(self, idx: int) -> np.ndarray:
        """The raw ``seq_len (+1)`` token ids of sample ``idx`` (int64), padded with the pad id if short."""
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for {len(self)} samples ({self.split_name} of {self.path})")
        extra = int(self.config.add_extra_token)
        row = int(self.shuffle_index[idx])
        d0, o0 = (int(v) for v in self.sample_index[row])
        d1, o1 = (int(v) for v in self.sample_index[row + 1])
        docs, get = self.document_index, self.indexed.get
        if d0 == d1:
            parts = [get(int(docs[d0]), o0, o1 - o0 + extra)]
        else:
            parts = [get(int(docs[d0]), o0)]
            parts += [get(int(docs[d])) for d in range(d0 + 1, d1)]
            parts.append(get(int(docs[d1]), 0, o1 + extra))
        chunk = np.concatenate(parts, dtype=np.int64)
        short = self.config.seq_len + extra - len(chunk)
        return np.concatenate((chunk, np.full(short, self._pad, np.int64))) if short > 0 else chunk

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return make_example(self.tokens(idx), self.config, self._pad)


def _document_ids(documents, n_documents: int, path: str) -> tuple[np.ndarray, object]:
    """Document ids (int32, as Megatron keeps them) and a short key for the cache description."""
    if isinstance(documents, tuple) and len(documents) == 2:
        start, end = int(documents[0]), int(documents[1])
        if not 0 <= start <= end <= n_documents:
            raise ValueError(f"{path}: document range {documents} outside [0, {n_documents}]")
        return np.arange(start, end, dtype=np.int32), [start, end]
    ids = np.asarray(documents, dtype=np.int64)
    if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= n_documents)):
        raise ValueError(f"{path}: document ids must be a 1-D array within [0, {n_documents})")
    ids = ids.astype(np.int32)
    return ids, {"ids": hashlib.blake2b(ids.tobytes(), digest_size=16).hexdigest(), "n": int(ids.size)}


def make_example(chunk: np.ndarray, config: GPTDatasetConfig, pad: int) -> dict[str, torch.Tensor]:
    """Inputs, pre-shifted labels (-100 where not trained on), loss mask and positions for one sample."""
    if config.add_extra_token:
        tokens, labels = chunk[:-1].copy(), chunk[1:].copy()
    else:
        tokens, labels = chunk.copy(), np.roll(chunk, -1)
        labels[-1] = pad
    n = len(tokens)
    is_eod = tokens == config.eod_id
    loss_mask = np.ones(n, np.float32)
    if config.eod_mask_loss:
        loss_mask[is_eod] = 0.0  # Megatron masks where the *input* is EOD (the prediction across documents)
    loss_mask[labels == pad] = 0.0
    positions = np.arange(n, dtype=np.int64)
    out: dict[str, torch.Tensor] = {}
    if config.reset_position_ids or config.reset_attention_mask:
        doc_start = np.zeros(n, dtype=bool)
        doc_start[1:] = is_eod[:-1]  # a new document begins right after each EOD
        if config.reset_position_ids:
            positions -= np.maximum.accumulate(np.where(doc_start, positions, 0))
        if config.reset_attention_mask:
            # Megatron's [T, T] mask is causal and blocks attention across an EOD; that is exactly
            # "causal within equal segment ids", which this compact form carries. Ids start at 1: 0 means
            # padding to the loss, and a short sample's pad tokens stay in its last document, as in Megatron.
            out["segments"] = torch.from_numpy(np.cumsum(doc_start, dtype=np.int64) + 1)
    tokens[tokens == pad] = 0  # the embedding must accept every input id
    labels[loss_mask == 0.0] = IGNORE_INDEX
    return {
        "tokens": torch.from_numpy(tokens),
        "labels": torch.from_numpy(labels),
        "loss_mask": torch.from_numpy(loss_mask),
        "position_ids": torch.from_numpy(positions),
        **out,
    }
