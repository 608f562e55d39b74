"""Pretraining with ``data.reset_attention_mask``: the attention Megatron's GPTDataset asks for is the attention the
model applies, on the same token files."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import default_collate

from longboat.data.labels import IGNORE_INDEX
from longboat.models.llm import Decoder, DecoderConfig
from longboat.models.llm.model import segment_attention_mask
from longboat.tasks.pretrain import Pretrain, PretrainDataConfig
from longboat.trainer.config import TrainerConfig
from tests.data.test_gpt import megatron_build

SEQ, BATCH = 96, 8


def forward_with_mask(model: Decoder, tokens, positions, allowed) -> torch.Tensor:
    """The decoder's forward with an explicit [B, 1, T, T] attention mask (True: may attend)."""
    cos, sin = model.rope_cos[positions], model.rope_sin[positions]
    h = model.tok_embeddings(tokens)
    for layer in model.layers:
        h, _ = layer(h, cos, sin, None, allowed)
    return F.linear(model.norm(h), model.output_weight)


def test_reset_attention_mask_is_megatrons_mask_applied_in_the_model(corpus, tmp_path, one_thread):
    tokenizer, prefix = corpus
    data = PretrainDataConfig(tokenizer=str(tokenizer), paths=[prefix], seq_len=SEQ, eod_mask_loss=True,
                              reset_position_ids=True, reset_attention_mask=True, cache_dir=str(tmp_path))
    model_cfg = DecoderConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                              max_seq_len=SEQ)
    built = Pretrain(data).build(model_cfg, TrainerConfig(steps=1, micro_batch_size=BATCH, eval_batches=1), 1234, 1)
    ours = built.train
    theirs = megatron_build([prefix], None, data.split, [BATCH, BATCH, 0], ours.config, attention_mask=True)[0]

    samples = [ours[i] for i in range(BATCH)]
    reference = [theirs[i] for i in range(BATCH)]
    for i, (a, b) in enumerate(zip(samples, reference)):
        assert torch.equal(segment_attention_mask(a["segments"][None])[0, 0], ~b["attention_mask"][0]), i
        assert torch.equal(a["position_ids"], b["position_ids"]), i  # restart after each EOD, as Megatron's
    batch, ref = default_collate(samples), default_collate(reference)
    assert (batch["segments"].amax(dim=1) > 1).sum() >= BATCH // 2  # most samples hold several documents

    torch.manual_seed(0)
    model = Decoder(model_cfg).eval()
    out = built.loss_fn(model, batch)
    with torch.no_grad():
        expected = forward_with_mask(model, ref["tokens"], ref["position_ids"], ~ref["attention_mask"])
        got = model(batch["tokens"], batch["position_ids"], None, batch["segments"])
        causal = model(batch["tokens"], batch["position_ids"])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (causal - expected).abs().max() > 1e-2  # attending across documents would change the logits
    labels = torch.where(ref["loss_mask"] > 0, ref["labels"], IGNORE_INDEX)
    ref_loss = F.cross_entropy(expected.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    torch.testing.assert_close(out.loss_sum.detach(), ref_loss, atol=1e-3, rtol=1e-5)
    assert int(out.count) == int(ref["loss_mask"].sum())
    assert int(out.units) == BATCH * SEQ  # every position belongs to a document (segment ids start at 1)


def test_plain_pretraining_batches_carry_no_segments(corpus, tmp_path):
    tokenizer, prefix = corpus
    data = PretrainDataConfig(tokenizer=str(tokenizer), paths=[prefix], seq_len=SEQ, cache_dir=str(tmp_path))
    model_cfg = DecoderConfig(vocab_size=512, d_model=32, n_layers=1, n_heads=4, ffn_dim=64, max_seq_len=SEQ)
    built = Pretrain(data).build(model_cfg, TrainerConfig(steps=1, micro_batch_size=2, eval_batches=0), 1, 1)
    assert "segments" not in built.train[0]
    torch.manual_seed(0)
    out = built.loss_fn(Decoder(model_cfg), default_collate([built.train[0], built.train[1]]))
    assert int(out.units) == 2 * SEQ
