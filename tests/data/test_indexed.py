"""Megatron ``.bin``/``.idx`` interop: our reader and writer against megatron-core's, both ways."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronDataset
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from longboat.data.indexed import IndexedDataError, IndexedDataset, IndexedDatasetWriter

# Documents as lists of sequences; the second and fourth have several sequences (sentence splits).
DOCS = [
    [[1, 2, 3, 4]],
    [[5, 6], [7], [8, 9, 10]],
    [[11]],
    [[12, 13, 14], [15, 16]],
]
DTYPES = [np.uint16, np.int32]


def _docs_for(dtype) -> list[list[list[int]]]:
    """DOCS with ids only the dtype can hold (above uint16's range for int32), so width matters."""
    base = 70000 if dtype == np.int32 else 60000
    return [[[base + t for t in seq] for seq in doc] for doc in DOCS]


def _write_ours(prefix, dtype, docs) -> None:
    with IndexedDatasetWriter(prefix, dtype) as w:
        for doc in docs:
            for seq in doc:
                w.add_sequence(seq)
            w.end_document()


def _write_megatron(prefix, dtype, docs) -> None:
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for i, doc in enumerate(docs):
        if i % 2:  # both of the builder's APIs: whole documents and item by item
            flat = [t for seq in doc for t in seq]
            builder.add_document(torch.tensor(flat, dtype=torch.int64), [len(s) for s in doc])
        else:
            for seq in doc:
                builder.add_item(torch.tensor(seq, dtype=torch.int64))
            builder.end_document()
    builder.finalize(f"{prefix}.idx")


def _expected(docs):
    seqs = [seq for doc in docs for seq in doc]
    doc_idx = np.cumsum([0] + [len(doc) for doc in docs])
    return seqs, doc_idx


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_ours_read_by_megatron(tmp_path, dtype):
    docs = _docs_for(dtype)
    _write_ours(tmp_path / "ours", dtype, docs)
    ds = MegatronDataset(str(tmp_path / "ours"))
    seqs, doc_idx = _expected(docs)
    assert ds.index.dtype == dtype
    assert len(ds) == len(seqs)
    np.testing.assert_array_equal(ds.document_indices, doc_idx)
    np.testing.assert_array_equal(ds.sequence_lengths, [len(s) for s in seqs])
    for i, seq in enumerate(seqs):
        np.testing.assert_array_equal(ds[i], seq)
    np.testing.assert_array_equal(ds.get(1, offset=1, length=1), seqs[1][1:2])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_megatron_read_by_ours(tmp_path, dtype):
    docs = _docs_for(dtype)
    _write_megatron(tmp_path / "meg", dtype, docs)
    ds = IndexedDataset(tmp_path / "meg")
    seqs, doc_idx = _expected(docs)
    assert ds.dtype == np.dtype(dtype)
    assert len(ds) == len(seqs) and ds.num_documents == len(docs)
    assert ds.num_tokens == sum(map(len, seqs))
    np.testing.assert_array_equal(ds.document_indices, doc_idx)
    for i, seq in enumerate(seqs):
        np.testing.assert_array_equal(ds[i], seq)
    np.testing.assert_array_equal(ds.get(3, offset=1, length=2), seqs[3][1:3])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_files_are_byte_identical(tmp_path, dtype):
    docs = _docs_for(dtype)
    _write_ours(tmp_path / "ours", dtype, docs)
    _write_megatron(tmp_path / "meg", dtype, docs)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"ours{suffix}").read_bytes() == (tmp_path / f"meg{suffix}").read_bytes()


def test_add_index_concatenates_megatron_shards(tmp_path):
    docs = _docs_for(np.uint16)
    _write_megatron(tmp_path / "a", np.uint16, docs[:2])
    _write_megatron(tmp_path / "b", np.uint16, docs[2:])
    with IndexedDatasetWriter(tmp_path / "all", np.uint16) as w:
        w.add_index(tmp_path / "a")
        w.add_index(tmp_path / "b")
    ds = MegatronDataset(str(tmp_path / "all"))
    seqs, doc_idx = _expected(docs)
    np.testing.assert_array_equal(ds.document_indices, doc_idx)
    for i, seq in enumerate(seqs):
        np.testing.assert_array_equal(ds[i], seq)


# Bad input: every failure is an IndexedDataError naming the offending file.


@pytest.fixture
def pair(tmp_path):
    _write_ours(tmp_path / "ds", np.uint16, DOCS)
    return tmp_path / "ds"


@pytest.mark.parametrize("suffix", [".bin", ".idx"])
def test_missing_file(pair, suffix):
    path = pair.with_name(pair.name + suffix)
    path.unlink()
    with pytest.raises(IndexedDataError, match=re.escape(str(path))):
        IndexedDataset(pair)


def test_wrong_magic(pair):
    idx = pair.with_name("ds.idx")
    data = bytearray(idx.read_bytes())
    data[:9] = b"NOTANIDX\x00"
    idx.write_bytes(bytes(data))
    with pytest.raises(IndexedDataError, match=re.escape(str(idx)) + ".*magic"):
        IndexedDataset(pair)


@pytest.mark.parametrize("keep", [10, -8], ids=["inside-header", "inside-indices"])
def test_truncated_idx(pair, keep):
    idx = pair.with_name("ds.idx")
    idx.write_bytes(idx.read_bytes()[:keep])
    with pytest.raises(IndexedDataError, match=re.escape(str(idx))):
        IndexedDataset(pair)


@pytest.mark.parametrize("change", [-2, 2], ids=["short", "long"])
def test_bin_size_mismatch(pair, change):
    bin_ = pair.with_name("ds.bin")
    data = bin_.read_bytes()
    bin_.write_bytes(data[:change] if change < 0 else data + b"\x00" * change)
    with pytest.raises(IndexedDataError, match=re.escape(str(bin_)) + ".*does not match"):
        IndexedDataset(pair)
