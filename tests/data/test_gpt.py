"""GPT sample construction: index parity with megatron-core's C++ helper, every sample of every split equal to
megatron-core's ``GPTDataset``, the index cache, and the errors Megatron lacks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from longboat.config.base import ConfigError
from longboat.data import gpt
from longboat.data.blend import build_gpt_datasets
from longboat.data.gpt import (
    DatasetTooSmallError,
    EmptySplitError,
    GPTDataset,
    GPTDatasetConfig,
    build_sample_index,
)
from longboat.data.indexed import IndexedDataset, IndexedDatasetWriter
from longboat.data.split import parse_split

EOD, PAD = 1, 3
SEQ = 32


def make_docs(seed: int, n: int, low: int = 5, high: int = 60, empty: int = 0, inner_eod: bool = False) -> list:
    """Documents of random length ending in EOD (as tokenizers write them); ``empty`` of them have no tokens."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        body = rng.integers(2, 50, rng.integers(low, high))
        if inner_eod:
            body[rng.random(len(body)) < 0.05] = EOD
        docs.append(np.append(body, EOD))
    for i in rng.choice(n, empty, replace=False):
        docs[i] = np.zeros(0, np.int64)
    return docs


def write_ours(prefix, docs, dtype=np.uint16) -> str:
    with IndexedDatasetWriter(prefix, dtype) as w:
        for doc in docs:
            w.add_document(doc)
    return str(prefix)


def write_megatron(prefix, docs, dtype=np.int32) -> str:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        builder.add_document(torch.from_numpy(np.asarray(doc, np.int64)), [len(doc)])
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


class MegatronTokenizer:
    """The little of a tokenizer that megatron-core's GPT dataset reads."""

    def __init__(self, eod: int, pad: int | None = None):
        self.eod, self.vocab_size = eod, None
        if pad is not None:
            self.pad = pad
        self.unique_identifiers = {"class": "MegatronTokenizer", "eod": eod, "pad": pad}


def megatron_build(prefixes, weights, split, sizes, cfg: GPTDatasetConfig, attention_mask=False):
    """megatron-core's BlendedMegatronDatasetBuilder on the same files and settings."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset as MGPTDataset
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MConfig

    mcfg = MConfig(
        random_seed=cfg.seed,
        sequence_length=cfg.seq_len,
        blend=(list(prefixes), weights),
        split=split,
        path_to_cache=None,
        tokenizer=MegatronTokenizer(cfg.eod_id, cfg.pad_id),
        reset_position_ids=cfg.reset_position_ids,
        reset_attention_mask=cfg.reset_attention_mask,
        eod_mask_loss=cfg.eod_mask_loss,
        create_attention_mask=attention_mask,
        add_extra_token_to_sequence=cfg.add_extra_token,
        drop_last_partial_validation_sequence=cfg.drop_last_partial_validation_sequence,
        mid_level_dataset_surplus=cfg.blend_surplus,
    )
    return BlendedMegatronDatasetBuilder(MGPTDataset, list(sizes), lambda: True, mcfg).build()


def assert_same_samples(ours, theirs, check_segments=False):
    """Every sample equal: tokens, loss mask, positions, and labels wherever Megatron trains on them."""
    assert (ours is None) == (theirs is None)
    if ours is None:
        return
    assert len(ours) == len(theirs)
    for i in range(len(theirs)):
        a, b = ours[i], theirs[i]
        assert torch.equal(a["tokens"], b["tokens"]), i
        assert torch.equal(a["loss_mask"], b["loss_mask"]), i
        on = b["loss_mask"] > 0
        assert torch.equal(a["labels"][on], b["labels"][on]), i
        assert bool((a["labels"][~on] == -100).all()), i
        assert torch.equal(a["position_ids"], b["position_ids"]), i
        if "dataset_id" in b:
            assert int(a["dataset_id"]) == int(b["dataset_id"]), i
        if check_segments:
            seg = a["segments"]
            allowed = torch.tril(seg[:, None] == seg[None, :])
            assert torch.equal(~allowed, b["attention_mask"][0]), i


def size_for(tokens_per_epoch: int, epochs: int, from_final: int) -> int:
    """The sample request that needs ``epochs`` epochs and takes ``from_final`` samples from the last one."""
    return ((epochs - 1) * tokens_per_epoch - 1) // SEQ + from_final


@pytest.fixture(scope="module")
def mcore():
    return pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_builder")


def test_sample_index_matches_megatron_helper(mcore):
    from megatron.core.datasets import helpers

    rng = np.random.default_rng(0)
    for trial in range(40):
        lengths = rng.integers(0 if trial % 2 else 1, rng.integers(2, 200), rng.integers(1, 300)).astype(np.int32)
        lengths[-1] = max(lengths[-1], 1) if trial % 4 == 0 else lengths[-1]
        tpe = int(lengths.sum())
        if tpe < 2:
            continue
        epochs, seq = int(rng.integers(1, 4)), int(rng.integers(2, 70))
        doc_index = np.tile(np.arange(len(lengths), dtype=np.int32), epochs)
        rng.shuffle(doc_index)
        for drop_last in (True, False):
            for extra in (True, False):
                if epochs * tpe - extra < seq:
                    continue
                ref = helpers.build_sample_idx(lengths, doc_index, seq, epochs, tpe, drop_last, extra)
                ours = build_sample_index(lengths, doc_index, seq, epochs, tpe, drop_last, extra)
                assert ours.dtype == ref.dtype and np.array_equal(ours, ref), (trial, drop_last, extra)


def test_single_file_splits_match_megatron(tmp_path, mcore):
    docs = make_docs(1, 2000)
    prefix = write_megatron(tmp_path / "mega", docs)  # written by megatron-core, read by us
    lengths = IndexedDataset(prefix).sequence_lengths
    (_, _), (vb, ve), (tb, te) = parse_split("90,6,4", len(docs))
    valid_tokens, test_tokens = int(lengths[vb:ve].sum()), int(lengths[tb:te].sum())
    # The last epoch is shuffled on its own below 80% of an epoch's samples: just below, and exactly at it.
    threshold = lambda tokens: int(0.8 * ((tokens - 1) // SEQ))  # noqa: E731
    valid_size = size_for(valid_tokens, 3, threshold(valid_tokens) - 1)
    sizes = [1500, valid_size, size_for(test_tokens, 2, threshold(test_tokens))]
    cfg = GPTDatasetConfig(seq_len=SEQ, seed=1234, eod_id=EOD, cache_dir=str(tmp_path / "cache"))
    ours = build_gpt_datasets([(prefix, 1.0)], "90,6,4", sizes, cfg)
    assert [d.num_epochs for d in ours] == [1, 3, 2]
    assert [d.separate_final_epoch for d in ours] == [False, True, False]
    for a, b in zip(ours, megatron_build([prefix], None, "90,6,4", sizes, cfg)):
        assert_same_samples(a, b)


def test_masks_positions_and_pad_match_megatron(tmp_path, mcore, one_thread):
    prefix = write_ours(tmp_path / "ours", make_docs(2, 300, empty=5, inner_eod=True))
    cfg = GPTDatasetConfig(
        seq_len=SEQ, seed=7, eod_id=EOD, pad_id=PAD, split="80,15,5",
        eod_mask_loss=True, reset_position_ids=True, reset_attention_mask=True,
    )
    sizes = [200, 60, 40]
    ours = build_gpt_datasets([(prefix, 1.0)], None, sizes, cfg)
    for a, b in zip(ours, megatron_build([prefix], None, "80,15,5", sizes, cfg, attention_mask=True)):
        assert_same_samples(a, b, check_segments=True)
    assert ours[0][0]["segments"].shape == (SEQ,)


def test_no_extra_token_and_partial_validation_sample_match_megatron(tmp_path, mcore):
    prefix = write_ours(tmp_path / "ours", make_docs(3, 400, empty=3))
    cfg = GPTDatasetConfig(
        seq_len=SEQ, seed=99, eod_id=EOD, split="70,20,10",
        add_extra_token=False, drop_last_partial_validation_sequence=False, eod_mask_loss=True,
    )
    sizes = [300, 400, None]  # None: one epoch
    ours = build_gpt_datasets([(prefix, 1.0)], None, sizes, cfg)
    theirs = megatron_build([prefix], None, "70,20,10", sizes, cfg)
    valid = ours[1]
    last = valid.sample_index[-1]
    assert last[0] == len(valid.document_index) - 1  # the valid split ends in a partial sample
    for a, b in zip(ours, theirs):
        assert_same_samples(a, b)


def test_cache_hit_returns_same_samples_without_rebuilding(tmp_path, monkeypatch):
    prefix = write_ours(tmp_path / "ours", make_docs(4, 200))
    cfg = GPTDatasetConfig(seq_len=SEQ, seed=5, eod_id=EOD, cache_dir=str(tmp_path / "cache"))
    first = GPTDataset(IndexedDataset(prefix), (0, 150), 500, cfg, "train")
    assert not first.from_cache
    calls = []
    real = gpt.build_sample_index
    monkeypatch.setattr(gpt, "build_sample_index", lambda *a, **k: calls.append(1) or real(*a, **k))
    second = GPTDataset(IndexedDataset(prefix), (0, 150), 500, cfg, "train")
    assert second.from_cache and not calls
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f"gpt-{first.cache_key}"]  # no temporaries left
    for i in range(len(first)):
        assert torch.equal(first[i]["tokens"], second[i]["tokens"])
    other = GPTDataset(IndexedDataset(prefix), (0, 150), 501, cfg, "train")  # a different request rebuilds
    assert not other.from_cache and calls


def test_document_id_array_equals_range(tmp_path):
    prefix = write_ours(tmp_path / "ours", make_docs(5, 100))
    cfg = GPTDatasetConfig(seq_len=SEQ, seed=5, eod_id=EOD)
    a = GPTDataset(IndexedDataset(prefix), (10, 90), 100, cfg)
    b = GPTDataset(IndexedDataset(prefix), np.arange(10, 90), 100, cfg)
    assert len(a) == len(b) and all(torch.equal(a[i]["tokens"], b[i]["tokens"]) for i in range(len(a)))


def test_empty_split_raises_naming_split_and_file(tmp_path):
    prefix = write_ours(tmp_path / "small", make_docs(6, 50))
    cfg = GPTDatasetConfig(seq_len=SEQ, seed=1, eod_id=EOD)  # "969,30,1": test gets round(0.001 * 50) = 0 docs
    with pytest.raises(EmptySplitError, match=r"test split of .*small has no documents"):
        build_gpt_datasets([(prefix, 1.0)], None, [10, 10, 10], cfg)
    assert build_gpt_datasets([(prefix, 1.0)], None, [10, 10, 0], cfg)[2] is None
    with pytest.raises(EmptySplitError, match="no tokens"):
        GPTDataset(IndexedDataset(write_ours(tmp_path / "blank", make_docs(6, 5, empty=5))), (0, 5), 1, cfg)


def test_too_short_split_raises(tmp_path):
    prefix = write_ours(tmp_path / "short", [np.arange(2, 12)])  # 10 tokens < 32 + 1
    cfg = GPTDatasetConfig(seq_len=SEQ, seed=1, eod_id=EOD, split="1")
    with pytest.raises(DatasetTooSmallError, match=r"train split of .*short has 10 tokens"):
        build_gpt_datasets([(prefix, 1.0)], None, [4, 0, 0], cfg)


def test_config_rejects_bad_split_and_pad():
    with pytest.raises(ValueError, match="split"):
        GPTDatasetConfig(seq_len=SEQ, seed=1, eod_id=EOD, split="90;10")
    with pytest.raises(ValueError, match="pad_id"):
        GPTDatasetConfig(seq_len=SEQ, seed=1, eod_id=EOD, pad_id=EOD)
    with pytest.raises(ValueError):
        GPTDatasetConfig(seq_len=SEQ, seed=1, eod_id=EOD, split_ratio="1")
    assert issubclass(EmptySplitError, ValueError) and issubclass(ConfigError, ValueError)
