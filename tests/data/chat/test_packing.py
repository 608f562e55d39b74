"""Packing: best-fit decreasing fills rows tightly and deterministically; every sample lands once, whole, with
positions restarting at 0 and labels that never reach into another sample."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longboat.data.chat.packing import best_fit_decreasing, pack, pad
from longboat.data.chat.supervision import Sample
from longboat.data.labels import IGNORE_INDEX

PAD = 0


def samples_of(lengths: list[int]) -> list[Sample]:
    """Sample i holds tokens 1000*i+1.. and labels 1000*i+2.. (every token supervised), so each is recognisable."""
    out = []
    for i, n in enumerate(lengths):
        tokens = np.arange(1, n + 1, dtype=np.int32) + 1000 * i
        out.append(Sample(tokens, tokens + 1))
    return out


def reference_best_fit(lengths, capacity):
    """Best-fit decreasing by its definition: scan every open bin for the tightest fit (the first on ties)."""
    bins, room = [], []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fits = [b for b in range(len(bins)) if room[b] >= lengths[i]]
        if fits:
            b = min(fits, key=lambda b: (room[b], b))
        else:
            b = len(bins)
            bins.append([])
            room.append(capacity)
        bins[b].append(i)
        room[b] -= lengths[i]
    return bins


@pytest.mark.parametrize("capacity", [16, 64, 512])
def test_best_fit_decreasing_equals_its_definition(capacity):
    rng = np.random.default_rng(capacity)
    for _ in range(5):
        lengths = rng.integers(1, capacity + 1, size=int(rng.integers(1, 300))).tolist()
        lengths += [capacity // 2] * 7 + [1] * 5  # ties in length and in room
        assert best_fit_decreasing(lengths, capacity) == reference_best_fit(lengths, capacity)


def test_best_fit_decreasing_places_each_sample_in_the_tightest_row():
    # 7, 6 and 5 open rows 0-2 (room 3, 4, 5); 4 fills row 1 exactly, not row 2; 3 fills row 0; 2 and 1 go to row 2.
    assert best_fit_decreasing([3, 7, 5, 4, 6, 2, 1], 10) == [[1, 0], [4, 3], [2, 5, 6]]
    assert best_fit_decreasing([], 10) == []
    with pytest.raises(ValueError, match="1..10"):
        best_fit_decreasing([11], 10)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 32), max_size=60), st.integers(32, 64))
def test_packed_rows_hold_every_sample_once_and_apart(lengths, seq_len):
    samples = samples_of(lengths)
    rows = pack(samples, seq_len, PAD)
    assert pack(samples, seq_len, PAD).row_samples.tolist() == rows.row_samples.tolist()  # deterministic
    seen = []
    for r in range(len(rows)):
        row = rows[r]
        tokens, labels, positions, segments = (row[k].numpy() for k in ("tokens", "labels", "position_ids",
                                                                        "segments"))
        assert tokens.shape == (seq_len,)
        used = int((segments > 0).sum())
        assert (segments[used:] == 0).all() and (tokens[used:] == PAD).all() and (labels[used:] == IGNORE_INDEX).all()
        for k in range(1, segments.max() + 1):
            where = np.flatnonzero(segments == k)
            assert (np.diff(where) == 1).all()  # contiguous
            i = int(tokens[where[0]]) // 1000
            assert tokens[where].tolist() == samples[i].tokens.tolist()
            assert labels[where].tolist() == samples[i].labels.tolist()  # never a label of another sample
            assert positions[where].tolist() == list(range(len(where)))
            seen.append(i)
    assert sorted(seen) == list(range(len(lengths)))
    # Best fit decreasing never leaves two rows that could have been one.
    fill = sorted(int((rows[r]["segments"] > 0).sum()) for r in range(len(rows)))
    assert len(fill) < 2 or fill[0] + fill[1] > seq_len
    assert rows.efficiency == pytest.approx(sum(lengths) / max(len(rows) * seq_len, 1))


def test_packing_fills_rows_far_better_than_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 120, size=400).tolist()
    packed, padded = pack(samples_of(lengths), 256, PAD), pad(samples_of(lengths), 256, PAD)
    assert len(padded) == 400 and padded.efficiency < 0.3
    assert packed.efficiency > 0.97 and len(packed) == int(np.ceil(sum(lengths) / 256))


def test_padded_rows_hold_one_sample_each():
    rows = pad(samples_of([3, 5]), 6, PAD)
    row = rows[1]
    assert row["tokens"].tolist() == [1001, 1002, 1003, 1004, 1005, PAD]
    assert row["labels"].tolist() == [1002, 1003, 1004, 1005, 1006, IGNORE_INDEX]
    assert row["segments"].tolist() == [1, 1, 1, 1, 1, 0] and row["position_ids"].tolist() == [0, 1, 2, 3, 4, 0]
    with pytest.raises(ValueError, match="at most 4"):
        pad(samples_of([5]), 4, PAD)
