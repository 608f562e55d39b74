"""The text encoder: a registry decoder's hidden states per caption (transformers' own for a Hugging Face directory),
independent of padding, from random weights or an export alike, and a fingerprint that follows weights and settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from longboat.checkpoint.export import save_export
from longboat.config.base import ConfigError
from longboat.tasks.text_encoder import TextEncoder, TextEncoderConfig

TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "sft" / "tokenizer"
DECODER = {"vocab_size": 512, "d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 64,
           "max_seq_len": 64}
CAPTIONS = ["a red circle", "a blue square", "", "a yellow triangle on black, small"]
pytestmark = pytest.mark.usefixtures("one_thread")


def encoder_config(**changes) -> dict:
    return {"arch": "decoder", "preset": "tiny", "overrides": DECODER, "tokenizer": str(TOKENIZER), **changes}


def make(**changes) -> TextEncoder:
    return TextEncoder(TextEncoderConfig.model_validate(encoder_config(**changes)))


def test_last_layer_states_are_the_decoders_own_and_independent_of_the_batch():
    enc = make()
    assert enc.hidden_size == 32
    text, mask = enc.encode(CAPTIONS)
    ids = enc.token_ids(CAPTIONS)
    assert text.shape == (4, max(map(len, ids)), 32) and mask.sum(1).tolist() == [len(s) for s in ids]
    assert ids[2] == [enc.tokenizer.bos_id]  # the empty caption still has a token: its BOS
    for i, caption in enumerate(CAPTIONS):
        want = enc.model.hidden_states(torch.tensor([ids[i]]))[0]
        torch.testing.assert_close(text[i, :len(ids[i])], want, rtol=0, atol=1e-5)  # batched matmuls round apart
        assert not text[i, len(ids[i]):].any()  # padding is zeros
        alone, _ = enc.encode([caption])
        torch.testing.assert_close(alone[0], text[i, :alone.shape[1]], rtol=0, atol=1e-5)


def test_an_inner_layer_and_max_tokens():
    last, _ = make().encode(CAPTIONS)
    inner, mask = make(layer=0, max_tokens=3).encode(CAPTIONS)
    assert inner.shape[1] == 3 and mask.sum(1).max() == 3
    assert not torch.allclose(inner[0, :3], last[0, :3])
    rms = inner[0, :3].pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones(3), atol=1e-2, rtol=0)  # normalised (eps aside)
    with pytest.raises(ConfigError, match="layer=5: the encoder has 2 blocks"):
        make(layer=5).encode(["x"])


def test_an_export_encodes_as_the_weights_it_holds(tmp_path):
    enc = make(seed=3)
    save_export(tmp_path / "enc", enc.model, "decoder", enc.model_cfg.model_dump(mode="json"), overwrite=True)
    from_export = TextEncoder(TextEncoderConfig(path=str(tmp_path / "enc"), tokenizer=str(TOKENIZER)))
    assert from_export.fingerprint() == enc.fingerprint()
    torch.testing.assert_close(from_export.encode(CAPTIONS)[0], enc.encode(CAPTIONS)[0], rtol=0, atol=0)


def test_the_fingerprint_follows_weights_and_settings():
    base = make().fingerprint()
    assert make().fingerprint() == base
    assert make(seed=1).fingerprint() != base
    assert make(max_tokens=4).fingerprint() != base
    assert make(batch_size=2).fingerprint() == base  # how captions are batched changes no embedding


@pytest.mark.parametrize("changes, message", [
    ({"arch": None}, "exactly one of path"),
    ({"path": "x"}, "exactly one of path"),
    ({"tokenizer": None}, "arch needs tokenizer"),
])
def test_bad_settings_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        TextEncoderConfig.model_validate(encoder_config(**changes))


def test_a_missing_export_or_tokenizer_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"data.text_encoder: .*not a longboat export"):
        TextEncoder(TextEncoderConfig(path=str(tmp_path)))
    with pytest.raises(ConfigError, match="data.text_encoder.tokenizer: .*not found"):
        make(tokenizer=str(tmp_path / "none")).encode(["x"])


def test_a_hugging_face_decoder_encodes_as_transformers_hidden_states(tmp_path):
    import shutil

    import transformers

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)).eval()
    hf.save_pretrained(tmp_path / "hf")
    for file in TOKENIZER.iterdir():
        shutil.copy(file, tmp_path / "hf" / file.name)
    last = TextEncoder(TextEncoderConfig(path=str(tmp_path / "hf")))
    inner = TextEncoder(TextEncoderConfig(path=str(tmp_path / "hf"), layer=0, normalize=False))
    assert last.hidden_size == 32
    text, mask = last.encode(CAPTIONS)
    text0, _ = inner.encode(CAPTIONS)
    for i, ids in enumerate(last.token_ids(CAPTIONS)):
        with torch.no_grad():
            states = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
        n = int(mask[i].sum())
        assert n == len(ids)
        torch.testing.assert_close(text[i, :n], states[-1][0], rtol=1e-4, atol=1e-5)  # after the final norm
        torch.testing.assert_close(text0[i, :n], states[1][0], rtol=1e-4, atol=1e-5)  # block 0's output
