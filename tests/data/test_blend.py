"""Blends and splits: split ranges, blending order and every blended sample equal to megatron-core's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from longboat.config.base import ConfigError
from longboat.data import blend
from longboat.data.blend import BlendedDataset, blending_indices, build_gpt_datasets
from longboat.data.gpt import GPTDataset, GPTDatasetConfig
from longboat.data.indexed import IndexedDataset, IndexedDatasetWriter
from longboat.data.split import normalize, parse_split

EOD, SEQ = 1, 32


def write_file(prefix, seed: int, n: int, dtype=np.uint16, empty: int = 0, megatron: bool = False) -> str:
    """``n`` random EOD-terminated documents, ``empty`` of them blank; written by us or by megatron-core."""
    rng = np.random.default_rng(seed)
    docs = [np.append(rng.integers(2, 50, rng.integers(5, 60)), EOD) for _ in range(n)]
    for i in rng.choice(n, empty, replace=False):
        docs[i] = np.zeros(0, np.int64)
    if megatron:
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
        for doc in docs:
            builder.add_document(torch.from_numpy(doc.astype(np.int64)), [len(doc)])
        builder.finalize(f"{prefix}.idx")
    else:
        with IndexedDatasetWriter(prefix, dtype) as w:
            for doc in docs:
                w.add_document(doc)
    return str(prefix)


class MegatronTokenizer:
    def __init__(self, eod: int):
        self.eod, self.vocab_size = eod, None
        self.unique_identifiers = {"class": "MegatronTokenizer", "eod": eod}


def megatron_build(prefixes, weights, split, sizes, cfg: GPTDatasetConfig):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset as MGPTDataset
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MConfig

    mcfg = MConfig(
        random_seed=cfg.seed, sequence_length=cfg.seq_len, blend=(list(prefixes), weights), split=split,
        path_to_cache=None, tokenizer=MegatronTokenizer(cfg.eod_id), reset_position_ids=cfg.reset_position_ids,
        reset_attention_mask=False, eod_mask_loss=cfg.eod_mask_loss, create_attention_mask=False,
    )
    return BlendedMegatronDatasetBuilder(MGPTDataset, list(sizes), lambda: True, mcfg).build()


@pytest.fixture(scope="module")
def mcore():
    return pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_builder")


def test_parse_split_matches_megatron(mcore):
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    rng = np.random.default_rng(0)
    splits = ["969,30,1", "98,2", "1", "1,1,1", "0,1,0", "99,0,1", "0.7,0.2,0.1", "8/1/1", "33.3,33.3,33.4"]
    splits += [",".join(str(v) for v in rng.integers(0, 1000, rng.integers(1, 4))) for _ in range(200)]
    for split in splits:
        if sum(float(v) for v in split.replace("/", ",").split(",")) == 0:
            continue
        matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
        for n in (0, 1, 7, 50, 1000, 123457, int(rng.integers(1, 10**7))):
            want = [None if m is None else (int(round(m[0] * float(n))), int(round(m[1] * float(n)))) for m in matrix]
            assert parse_split(split, n) == want, (split, n)
    with pytest.raises(ConfigError):
        parse_split("1,2,3,4", 10)
    with pytest.raises(ConfigError):
        parse_split("0,0", 10)


def test_blending_indices_match_megatron_helper(mcore):
    from megatron.core.datasets import helpers

    rng = np.random.default_rng(1)
    cases = [([1.0], 1000), ([0.5, 0.5], 5000), ([0.7, 0.3], 300_000), ([5, 3, 2], 40_000), ([1, 1, 1], 9999)]
    cases += [([0.1, 0.2, 0.3, 0.4], 50_000), ([0.8, 0.2], 100_000)]
    cases += [(rng.random(d) + 0.01, int(rng.integers(1, 30_000))) for d in (2, 2, 3, 4, 5, 8, 13)]
    for weights, size in cases:
        weights = normalize(weights)
        ref_index = np.zeros(size, np.int16)
        ref_sample = np.zeros(size, np.int64)
        helpers.build_blending_indices(ref_index, ref_sample, weights, len(weights), size, False)
        index, sample = blending_indices(weights, size)
        assert np.array_equal(index, ref_index), weights
        assert np.array_equal(sample, ref_sample), weights


def test_blend_of_three_files_matches_megatron(tmp_path, mcore):
    prefixes = [
        write_file(tmp_path / "a", 10, 600, np.int32, megatron=True),
        write_file(tmp_path / "b", 11, 400, empty=4),
        write_file(tmp_path / "c", 12, 150),  # small: its valid and test splits run several epochs
    ]
    weights = [5.0, 3.0, 2.0]
    cfg = GPTDatasetConfig(seq_len=SEQ, seed=4321, eod_id=EOD, split="80,15,5", eod_mask_loss=True,
                           reset_position_ids=True, cache_dir=str(tmp_path / "cache"))
    sizes = [700, 240, 90]
    ours = build_gpt_datasets(list(zip(prefixes, weights)), None, sizes, cfg)
    theirs = megatron_build(prefixes, weights, "80,15,5", sizes, cfg)
    epochs = {ds.num_epochs for split in ours for ds in split.datasets}
    assert max(epochs) > 1 and 1 in epochs
    for a, b, n in zip(ours, theirs, sizes):
        assert isinstance(a, BlendedDataset) and len(a) == len(b) >= n
        assert [x.num_samples for x in a.datasets] == [y.num_samples for y in b.datasets]
        for i in range(len(b)):
            x, y = a[i], b[i]
            assert int(x["dataset_id"]) == int(y["dataset_id"]), i
            assert torch.equal(x["tokens"], y["tokens"]), i
            assert torch.equal(x["loss_mask"], y["loss_mask"]), i
            on = y["loss_mask"] > 0
            assert torch.equal(x["labels"][on], y["labels"][on]) and bool((x["labels"][~on] == -100).all()), i
            assert torch.equal(x["position_ids"], y["position_ids"]), i

    again = build_gpt_datasets(list(zip(prefixes, weights)), None, sizes, cfg)
    assert all(ds.from_cache for ds in again) and all(p.from_cache for ds in again for p in ds.datasets)
    assert all(torch.equal(again[0][i]["tokens"], ours[0][i]["tokens"]) for i in range(0, len(ours[0]), 7))


def test_two_file_blend_sizes_follow_megatron(tmp_path, mcore):
    prefixes = [write_file(tmp_path / "a", 20, 300), write_file(tmp_path / "b", 21, 300)]
    cfg = GPTDatasetConfig(seq_len=SEQ, seed=3, eod_id=EOD, split="90,10")
    train, valid, test = build_gpt_datasets([(prefixes[0], 0.9), (prefixes[1], 0.1)], None, [1000, 50, 5], cfg)
    assert test is None  # split weight 0
    assert [d.num_samples for d in train.datasets] == [905, 101] and len(train) == 1000
    theirs = megatron_build(prefixes, [0.9, 0.1], "90,10", [1000, 50, 5], cfg)
    assert theirs[2] is None
    for a, b in ((train, theirs[0]), (valid, theirs[1])):
        assert len(a) == len(b) and [x.num_samples for x in a.datasets] == [y.num_samples for y in b.datasets]
        assert np.array_equal(a.dataset_index, b.dataset_index)
        assert np.array_equal(a.dataset_sample_index, b.dataset_sample_index)
        for x, y in zip(a.datasets, b.datasets):
            assert np.array_equal(x.sample_index, y.sample_index) and np.array_equal(x.shuffle_index, y.shuffle_index)


def test_blend_refuses_oversampling_and_bad_weights(tmp_path):
    prefix = write_file(tmp_path / "a", 30, 100)
    cfg = GPTDatasetConfig(seq_len=SEQ, seed=3, eod_id=EOD)
    small = GPTDataset(IndexedDataset(prefix), (0, 100), None, cfg)
    with pytest.raises(blend.BlendOversampleError, match="blend_surplus"):
        BlendedDataset([small, small], [0.5, 0.5], 2 * len(small) + 10)
    with pytest.raises(ConfigError, match="positive"):
        build_gpt_datasets([(prefix, 1.0), (prefix, 0.0)], "1", [10, 0, 0], cfg)
    with pytest.raises(ConfigError, match="sample count"):
        build_gpt_datasets([(prefix, 1.0), (prefix, 1.0)], "1", [None, 0, 0], cfg)
