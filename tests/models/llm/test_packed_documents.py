"""Packed documents (segment ids) train exactly as the same documents one per sequence.

A packed row holds several documents, each with positions restarting at 0 and its own segment id (0 marks
padding). The reference runs every document alone, with no padding and no mask. Logits, the summed and the
per-sample loss, and the gradient of every parameter must agree, for each attention and feed-forward kind.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longboat.data.labels import IGNORE_INDEX
from longboat.models.llm import Decoder, DecoderConfig
from longboat.models.llm.model import one_document_per_row, segment_attention_mask
from longboat.tasks.lm_loss import make_lm_loss

VOCAB, SEQ = 64, 48
BASE = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=64)
MLA = dict(attention="mla", n_kv_heads=None, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
           qk_rope_head_dim=4, v_head_dim=8)
# Dropless routing without a balance loss: each token's experts and output depend on that token alone. A balance
# loss (switch, sequence) or a capacity limit is a statistic of the whole batch, padding included, so its value
# differs between a packed batch and the documents one by one even though every document's tokens agree.
MOE = dict(moe=dict(d_model=32, n_experts=4, top_k=2, expert_ffn_dim=24, aux_loss="none", capacity_factor=None),
           dense_layers=[0])
MODELS = {
    "dense-gqa": dict(BASE),
    "qwen3-qk-norm": dict(BASE, qk_norm=True, head_dim=16, tie_embeddings=True, norm_eps=1e-6),
    "mla": dict(BASE, **MLA),
    "moe": dict(BASE, **MOE),
}
# Rows of document lengths (very long next to a single token); the rest of each row is padding.
LAYOUT = [[37, 1, 6, 2], [9, 30, 3], [48], [5]]
pytestmark = pytest.mark.usefixtures("one_thread")  # models this small gain nothing from threads


def make_documents(lengths: list[int], seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tokens, pre-shifted labels) per document; the first few labels of longer ones are unsupervised, like a
    chat prompt."""
    g = torch.Generator().manual_seed(seed)
    docs = []
    for n in lengths:
        tokens = torch.randint(1, VOCAB, (n,), generator=g)
        labels = torch.randint(0, VOCAB, (n,), generator=g)
        labels[: n // 4] = IGNORE_INDEX
        docs.append((tokens, labels))
    return docs


def pack(docs: list[tuple[torch.Tensor, torch.Tensor]], rows: list[list[int]], seq_len: int) -> dict:
    """A packed batch: ``rows`` lists which documents (by index) share each row, in order."""
    B = len(rows)
    batch = {
        "tokens": torch.zeros(B, seq_len, dtype=torch.long),
        "labels": torch.full((B, seq_len), IGNORE_INDEX),
        "position_ids": torch.zeros(B, seq_len, dtype=torch.long),
        "segments": torch.zeros(B, seq_len, dtype=torch.long),
    }
    for r, row in enumerate(rows):
        at = 0
        for seg, i in enumerate(row, start=1):
            tokens, labels = docs[i]
            n = len(tokens)
            batch["tokens"][r, at : at + n] = tokens
            batch["labels"][r, at : at + n] = labels
            batch["position_ids"][r, at : at + n] = torch.arange(n)
            batch["segments"][r, at : at + n] = seg
            at += n
    return batch


def rows_of(layout: list[list[int]]) -> list[list[int]]:
    """Document indices per row for a layout of lengths."""
    rows, i = [], 0
    for lengths in layout:
        rows.append(list(range(i, i + len(lengths))))
        i += len(lengths)
    return rows


def packed_run(model, docs, rows, per_sample: bool, seq_len: int = SEQ):
    batch = pack(docs, rows, seq_len)
    model.zero_grad(set_to_none=True)
    out = make_lm_loss(use_position_ids=True, use_segments=True, per_sample=per_sample)(model, batch)
    out.loss_sum.backward()
    with torch.no_grad():
        logits = model(batch["tokens"], batch["position_ids"], None, batch["segments"])
    per_doc = [[logits[r, batch["segments"][r] == s] for s in range(1, len(row) + 1)] for r, row in enumerate(rows)]
    return out, [x for row in per_doc for x in row], grads(model), batch


def alone_run(model, docs, per_sample: bool):
    """Each document as its own batch of one, no mask: summed losses and gradients, the logits per document."""
    loss_fn = make_lm_loss(use_position_ids=False, per_sample=per_sample)
    model.zero_grad(set_to_none=True)
    loss_sum, count, logits = 0.0, 0, []
    for tokens, labels in docs:
        out = loss_fn(model, {"tokens": tokens[None], "labels": labels[None]})
        out.loss_sum.backward()
        loss_sum, count = loss_sum + out.loss_sum.detach(), count + int(out.count)
        with torch.no_grad():
            logits.append(model(tokens[None])[0])
    return loss_sum, count, logits, grads(model)


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def build(name: str, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(DecoderConfig(**MODELS[name])).train()


def assert_packed_equals_alone(model, docs, rows, per_sample, rel=None):
    """Exact to fp32 rounding; with ``rel``, each tensor within that relative error (norm of the difference)."""
    out, packed_logits, packed_grads, batch = packed_run(model, docs, rows, per_sample)
    loss_sum, count, alone_logits, alone_grads = alone_run(model, docs, per_sample)

    def close(a, b, atol, msg):
        if rel is None:
            torch.testing.assert_close(a, b, atol=atol, rtol=1e-4, msg=msg)
        else:
            assert (a - b).norm() <= rel * b.norm(), f"{msg}: relative error {(a - b).norm() / b.norm():.2e}"

    for i, (a, b) in enumerate(zip(packed_logits, alone_logits)):
        close(a, b, 1e-5, f"logits of document {i}")
    assert int(out.count) == count
    close(out.loss_sum.detach(), torch.as_tensor(loss_sum), 1e-4, "loss sum")
    assert int(out.units) == int((batch["segments"] > 0).sum())
    assert packed_grads.keys() == alone_grads.keys()
    for n, g in alone_grads.items():
        assert g.abs().max() > 0, n  # every parameter takes part, so the comparison is not vacuous
        close(packed_grads[n], g, 1e-6, n)


@pytest.mark.parametrize("per_sample", [False, True], ids=["summed-tokens", "per-sample"])
@pytest.mark.parametrize("name", list(MODELS))
def test_packed_batch_equals_documents_alone(name, per_sample):
    lengths = [n for row in LAYOUT for n in row]
    assert_packed_equals_alone(build(name), make_documents(lengths), rows_of(LAYOUT), per_sample)


def test_per_sample_weighs_documents_equally():
    """Per-sample: count = documents with a supervised token; the loss sum is the sum of their means."""
    model = build("dense-gqa")
    docs = make_documents([20, 3, 12])
    docs[1][1][:] = IGNORE_INDEX  # a document with nothing to learn counts for nothing
    out, _, _, _ = packed_run(model, docs, [[0, 1, 2]], per_sample=True, seq_len=40)
    assert int(out.count) == 2
    means = []
    for i in (0, 2):
        one = make_lm_loss(False, per_sample=True)(model, {"tokens": docs[i][0][None], "labels": docs[i][1][None]})
        means.append(one.loss_sum.detach())
    torch.testing.assert_close(out.loss_sum.detach(), sum(means), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_packed_batch_equals_documents_alone_in_bf16_autocast(name):
    """Under bf16 autocast the packed and the one-by-one runs round differently (measured: at most 0.5%
    relative error); they agree to within 2%."""
    lengths = [n for row in LAYOUT for n in row]
    model = build(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert_packed_equals_alone(model, make_documents(lengths), rows_of(LAYOUT), per_sample=False, rel=0.02)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(1, 24), min_size=1, max_size=6), st.integers(0, 2**16))
def test_any_document_lengths_pack_exactly(lengths, seed):
    """One row holding documents of random lengths, then padding, equals the documents one by one."""
    model = build("dense-gqa", seed % 7)
    docs = make_documents(lengths, seed)
    out, packed_logits, _, _ = packed_run(model, docs, [list(range(len(docs)))], per_sample=False,
                                          seq_len=sum(lengths) + seed % 5)
    loss_sum, count, alone_logits, _ = alone_run(model, docs, per_sample=False)
    for a, b in zip(packed_logits, alone_logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert int(out.count) == count
    torch.testing.assert_close(out.loss_sum.detach(), torch.as_tensor(loss_sum), atol=1e-4, rtol=1e-5)


def test_segment_mask_is_causal_within_documents_only():
    segments = torch.tensor([[1, 1, 2, 2, 2, 0, 0]])
    mask = segment_attention_mask(segments)[0, 0]
    expected = torch.zeros(7, 7, dtype=torch.bool)
    for lo, hi in ((0, 2), (2, 5), (5, 7)):
        expected[lo:hi, lo:hi] = torch.ones(hi - lo, hi - lo, dtype=torch.bool).tril()
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("name", ["dense-gqa", "mla"])
def test_segments_with_a_kv_cache_are_refused(name):
    model = build(name).eval()
    tokens = torch.randint(0, VOCAB, (1, 5))
    with pytest.raises(ValueError, match="segments .* not cached decoding"):
        model(tokens, cache=model.make_cache(1, 8), segments=torch.ones_like(tokens))


@pytest.mark.parametrize("rows, single", [
    ([[1, 1, 1, 0, 0], [2, 2, 2, 2, 2], [0, 0, 0, 0, 0]], True),
    ([[1, 1, 2, 2, 0]], False),  # two documents
    ([[0, 0, 1, 1, 1]], False),  # left padding: causal attention would let the document see the padding
    ([[1, 1, 0, 1, 1]], False),
])
def test_one_document_per_row_is_recognised(rows, single):
    assert one_document_per_row(torch.tensor(rows)) is single


@pytest.mark.parametrize("per_sample", [False, True], ids=["summed-tokens", "per-sample"])
def test_one_document_per_row_with_padding_equals_documents_alone(per_sample):
    """Padded rows of one document each take SDPA's causal path and still match the documents alone."""
    lengths = [30, 12, 5]
    docs = make_documents(lengths, seed=3)
    assert one_document_per_row(pack(docs, [[0], [1], [2]], SEQ)["segments"])
    assert_packed_equals_alone(build("dense-gqa"), docs, [[0], [1], [2]], per_sample)
