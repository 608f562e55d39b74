"""Tokenizer: byte-level BPE training, lossless round trips, HF directory layout both ways."""

from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import models, pre_tokenizers
from transformers import AutoTokenizer

from longboat.data.tokenizer import EOS_TOKEN, Tokenizer, TokenizerError, train_bpe

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SOURCES = [STDLIB / name for name in ("textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py", "bisect.py")]
SAMPLES = [
    "def f(x):\n    return x + 1\n",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nwindows newlines\n\n\n",
    "unicode: héllo wörld — 東京 🚀 Ελληνικά",
    "control \x00\x01\x7f chars and an invisible \u200b space",
    f"special token inside text {EOS_TOKEN} and after",
    "",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Tokenizer:
    out = tmp_path_factory.mktemp("bpe")
    return train_bpe([str(p) for p in SOURCES], vocab_size=600, out_dir=out, show_progress=False)


def test_trained_tokenizer_basics(trained):
    assert trained.vocab_size == 600
    assert trained.eos_token == EOS_TOKEN
    assert trained.eos_id == trained.backend.token_to_id(EOS_TOKEN)
    assert trained.pad_id is None
    assert len(trained.encode("return self")) < len("return self")  # merges were learned


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip(trained, text):
    assert trained.decode(trained.encode(text)) == text


def test_encode_batch_matches_encode(trained):
    assert trained.encode_batch(SAMPLES) == [trained.encode(t) for t in SAMPLES]


def test_saved_directory_loads_in_transformers(trained, tmp_path):
    trained.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    trained.save(tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    text = SOURCES[0].read_text()[:3000] + SAMPLES[3]
    ids = trained.encode(text)
    assert hf(text, add_special_tokens=False)["input_ids"] == ids
    assert hf.decode(ids) == text
    assert hf.eos_token_id == trained.eos_id
    assert hf.chat_template == trained.chat_template
    assert len(hf) == trained.vocab_size
    reloaded = Tokenizer(tmp_path)
    assert reloaded.encode(text) == ids and reloaded.chat_template == trained.chat_template


def test_trains_from_jsonl_text_key(tmp_path):
    rows = [{"text": p.read_text(), "meta": 1} for p in SOURCES]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = train_bpe([str(tmp_path / "*.jsonl")], 400, tmp_path / "tok", show_progress=False)
    assert tok.vocab_size == 400
    assert tok.backend.token_to_id('Ġ"meta"') is None  # learned from the texts, not the JSON lines


def test_vocab_too_small(tmp_path):
    with pytest.raises(TokenizerError, match="vocab_size 100 is too small"):
        train_bpe([str(SOURCES[0])], 100, tmp_path)


def _word_level_dir(path: Path, config: dict | None = None, special: dict | None = None) -> Path:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "hello": 4, "world": 5}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<s>", "</s>", "<pad>", "<|im_end|>"])
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    if special is not None:
        (path / "special_tokens_map.json").write_text(json.dumps(special))
    return path


def test_loads_hf_config_files(tmp_path):
    config = {
        "bos_token": {"content": "<s>", "lstrip": False, "rstrip": False, "__type": "AddedToken"},
        "eos_token": "<unk>",
        "pad_token": None,
    }
    special = {"eos_token": "</s>", "pad_token": {"content": "<pad>"}}
    d = _word_level_dir(tmp_path / "t", config, special)
    (d / "chat_template.jinja").write_text("{{ messages }}")
    tok = Tokenizer(d)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 3)  # special_tokens_map.json wins
    assert tok.vocab_size == 7  # the added "<|im_end|>" counts
    assert tok.chat_template == "{{ messages }}"
    assert tok.encode("hello world") == [4, 5]


def test_eos_falls_back_to_known_names(tmp_path):
    assert Tokenizer(_word_level_dir(tmp_path / "t")).eos_id == 2  # "</s>", no config file


def test_missing_directory(tmp_path):
    with pytest.raises(TokenizerError, match=re.escape(f"{tmp_path / 'nope'}: tokenizer directory not found")):
        Tokenizer(tmp_path / "nope")


def test_directory_without_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerError, match=re.escape(f"{tmp_path}: no tokenizer.json")):
        Tokenizer(tmp_path)


def test_malformed_files(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a valid tokenizers file"):
        Tokenizer(tmp_path)
    d = _word_level_dir(tmp_path / "t", config={"eos_token": "<|missing|>"})
    with pytest.raises(TokenizerError, match=re.escape("eos_token '<|missing|>' is not in the vocabulary")):
        Tokenizer(d)


def test_no_text_to_train_on(tmp_path, capsys):
    from longboat.cli.main import main

    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(TokenizerError, match="no text to train a tokenizer on"):
        train_bpe([tmp_path / "empty.txt"], 300, tmp_path / "tok", show_progress=False)
    assert main(["data", "train-tokenizer", "--input", str(tmp_path / "empty.txt"), "--vocab-size", "300",
                 "--output", str(tmp_path / "tok")]) == 2
    err = capsys.readouterr().err
    assert f"error: no text to train a tokenizer on in {tmp_path / 'empty.txt'}" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "tok").exists()
