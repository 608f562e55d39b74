"""``tokenize_to_indexed`` and the ``longboat data`` command wiring."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronDataset
from tokenizers import Tokenizer as Backend
from tokenizers import models, pre_tokenizers

from longboat.cli import data as cli_data
from longboat.data import tokenize as tokenize_module
from longboat.data.indexed import IndexedDataset
from longboat.data.text_sources import TextSourceError
from longboat.data.tokenize import tokenize_to_indexed
from longboat.data.tokenizer import Tokenizer, TokenizerError, train_bpe

STDLIB = Path(sysconfig.get_paths()["stdlib"])
MODULES = ["textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py", "bisect.py", "keyword.py"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    train_bpe([str(STDLIB / m) for m in MODULES[:3]], 500, out, show_progress=False)
    return out


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Documents of varied length: whole modules, paragraphs, unicode, one-liners."""
    docs = [(STDLIB / m).read_text() for m in MODULES]
    docs += [p for p in docs[0].split("\n\n") if p.strip()][:40]
    docs += ["héllo 東京 🚀", "x", " ", "tab\tnewline\n"]
    return docs


def _write_jsonl(path: Path, texts: list[str], key: str = "text") -> Path:
    lines = [json.dumps({key: t, "id": i}) + "\n" for i, t in enumerate(texts)]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.writelines(lines)
    return path


def _documents(prefix) -> list[list[int]]:
    ds = IndexedDataset(prefix)
    return [np.concatenate([ds[s] for s in range(a, b)]).tolist()
            for a, b in zip(ds.document_indices[:-1], ds.document_indices[1:])]


def _expected(tok_dir, texts, eod=True) -> list[list[int]]:
    tok = Tokenizer(tok_dir)
    return [tok.encode(t) + ([tok.eos_id] if eod else []) for t in texts]


def test_jsonl_equals_direct_encoding_and_megatron_reads_it(tmp_path, tok_dir, texts):
    src = _write_jsonl(tmp_path / "in.jsonl", texts)
    stats = tokenize_to_indexed([src], tok_dir, tmp_path / "out", workers=1, batch_size=7, progress=False)
    expected = _expected(tok_dir, texts)
    assert _documents(tmp_path / "out") == expected
    assert (stats.documents, stats.tokens) == (len(texts), sum(map(len, expected)))
    meg = MegatronDataset(str(tmp_path / "out"))
    assert meg.index.dtype == np.uint16
    assert [meg[i].tolist() for i in range(len(meg))] == expected


def test_workers_give_identical_files(tmp_path, tok_dir, texts):
    src = _write_jsonl(tmp_path / "in.jsonl", texts)
    for w in (1, 2):
        tokenize_to_indexed([src], tok_dir, tmp_path / f"w{w}", workers=w, batch_size=3, progress=False)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"w1{suffix}").read_bytes() == (tmp_path / f"w2{suffix}").read_bytes()


def test_spawned_workers_load_the_tokenizer(tmp_path, tok_dir, texts, monkeypatch):
    """Where fork is not used (macOS), workers load the tokenizer themselves; same output."""
    monkeypatch.setattr(tokenize_module, "_start_method", lambda: "spawn")
    src = _write_jsonl(tmp_path / "in.jsonl", texts[:12])
    tokenize_to_indexed([src], tok_dir, tmp_path / "out", workers=2, batch_size=2, progress=False)
    assert _documents(tmp_path / "out") == _expected(tok_dir, texts[:12])


def test_mixed_inputs_keep_order(tmp_path, tok_dir, texts):
    _write_jsonl(tmp_path / "a.jsonl.gz", texts[:4], key="body")
    table = pa.table({"body": texts[4:20], "n": list(range(16))})
    pq.write_table(table, tmp_path / "b.parquet", row_group_size=5)
    (tmp_path / "c.txt").write_text(texts[20])
    (tmp_path / "d.txt").write_text(texts[21])
    inputs = [tmp_path / "a.jsonl.gz", tmp_path / "b.parquet", str(tmp_path / "*.txt")]
    stats = tokenize_to_indexed(inputs, tok_dir, tmp_path / "out", text_key="body", append_eod=False,
                                workers=2, batch_size=4, progress=False)
    assert _documents(tmp_path / "out") == _expected(tok_dir, texts[:22], eod=False)
    assert stats.documents == 22


@pytest.mark.parametrize("mode", ["file", "paragraph", "line"])
def test_txt_modes(tmp_path, tok_dir, mode):
    text = "first paragraph\nstill first\n\n  \nsecond one\n\n\nthird\n"
    (tmp_path / "a.txt").write_text(text)
    docs = {
        "file": [text],
        "paragraph": ["first paragraph\nstill first", "second one", "third"],
        "line": ["first paragraph", "still first", "second one", "third"],
    }[mode]
    tokenize_to_indexed([tmp_path / "a.txt"], tok_dir, tmp_path / "out", txt_mode=mode, progress=False)
    assert _documents(tmp_path / "out") == _expected(tok_dir, docs)


def test_empty_documents_are_skipped(tmp_path, tok_dir):
    src = _write_jsonl(tmp_path / "in.jsonl", ["a", "", "b"])
    with open(src, "a") as f:
        f.write("\n")  # a blank line is not a document
    stats = tokenize_to_indexed([src], tok_dir, tmp_path / "out", progress=False)
    assert (stats.documents, stats.skipped) == (2, 1)
    assert _documents(tmp_path / "out") == _expected(tok_dir, ["a", "b"])


def test_large_vocab_writes_int32(tmp_path):
    vocab = {"<unk>": 0, "a": 1, "b": 2, "<|endoftext|>": 70000}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    Tokenizer.from_backend(backend, {"eos_token": "<|endoftext|>"}).save(tmp_path / "tok")
    src = _write_jsonl(tmp_path / "in.jsonl", ["a b", "b"])
    tokenize_to_indexed([src], tmp_path / "tok", tmp_path / "out", progress=False)
    meg = MegatronDataset(str(tmp_path / "out"))
    assert meg.index.dtype == np.int32
    assert [meg[i].tolist() for i in range(len(meg))] == [[1, 2, 70000], [2, 70000]]


def test_prints_summary(tmp_path, tok_dir, capsys):
    src = _write_jsonl(tmp_path / "in.jsonl", ["one", "two"])
    tokenize_to_indexed([src], tok_dir, tmp_path / "out", workers=1)
    out = capsys.readouterr().out
    assert re.search(r"2 documents, \d+ tokens in [\d.]+ s \([\d,]+ tokens/s\)", out)


# Bad input: clear errors, and no output files left behind.


def _fails(tmp_path, tok_dir, inputs, error, pattern, **kw):
    with pytest.raises(error, match=pattern):
        tokenize_to_indexed(inputs, tok_dir, tmp_path / "out", progress=False, **kw)
    assert not list(tmp_path.glob("out.*"))


def test_missing_inputs(tmp_path, tok_dir):
    _fails(tmp_path, tok_dir, [], TextSourceError, "no input files")
    _fails(tmp_path, tok_dir, [tmp_path / "nope.jsonl"], FileNotFoundError,
           re.escape(f"{tmp_path}/nope.jsonl: input file not found"))
    _fails(tmp_path, tok_dir, [str(tmp_path / "*.parquet")], FileNotFoundError, "no files match")
    _fails(tmp_path, tok_dir, [tmp_path], FileNotFoundError, "is a directory")


@pytest.mark.parametrize("workers", [1, 2])
def test_missing_text_key_names_file_and_line(tmp_path, tok_dir, workers):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "ok"}\n\n{"content": "no text key"}\n')
    _fails(tmp_path, tok_dir, [src], TextSourceError, re.escape(f"{src}:3: no key 'text'") + ".*'content'",
           workers=workers)


def test_bad_jsonl_rows(tmp_path, tok_dir):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "ok"}\n{"text": \n')
    _fails(tmp_path, tok_dir, [src], TextSourceError, re.escape(f"{src}:2: not valid JSON"))
    src.write_text('{"text": 5}\n')
    _fails(tmp_path, tok_dir, [src], TextSourceError, re.escape(f"{src}:1: 'text' is int, expected a string"))
    src.write_text('{"text": "ok"}\n' + "[" * 100_000 + "\n")
    _fails(tmp_path, tok_dir, [src], TextSourceError, re.escape(f"{src}:2: JSON nested too deeply to read"))


def test_parquet_without_column(tmp_path, tok_dir):
    pq.write_table(pa.table({"content": ["a"]}), tmp_path / "in.parquet")
    _fails(tmp_path, tok_dir, [tmp_path / "in.parquet"], TextSourceError,
           re.escape(f"{tmp_path}/in.parquet: no column 'text' (columns: content)"))


def test_bad_tokenizer_and_options(tmp_path, tok_dir):
    src = _write_jsonl(tmp_path / "in.jsonl", ["a"])
    _fails(tmp_path, tmp_path / "none", [src], TokenizerError, "tokenizer directory not found")
    _fails(tmp_path, tok_dir, [src], TextSourceError, "txt_mode 'words'", txt_mode="words")
    _fails(tmp_path, tok_dir, [src], TokenizerError, "workers must be at least 1", workers=0)


# The command line: argparse wiring only (main.py owns dispatch and error printing).


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="longboat")
    cli_data.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_tokenize(tmp_path, tok_dir, capsys):
    src = _write_jsonl(tmp_path / "in.jsonl", ["one", "two", "three"])
    args = _parse("data", "tokenize", "--input", str(src), "--tokenizer", str(tok_dir),
                  "--output-prefix", str(tmp_path / "out"), "--no-eod", "--workers", "1")
    args.func(args)
    assert _documents(tmp_path / "out") == _expected(tok_dir, ["one", "two", "three"], eod=False)
    assert "3 documents" in capsys.readouterr().out


def test_cli_train_tokenizer(tmp_path):
    args = _parse("data", "train-tokenizer", "--input", str(STDLIB / "textwrap.py"), "--input",
                  str(STDLIB / "shlex.py"), "--vocab-size", "300", "--output", str(tmp_path / "tok"),
                  "--min-frequency", "3")
    assert (args.vocab_size, args.min_frequency) == (300, 3)
    args.func(args)
    assert Tokenizer(tmp_path / "tok").vocab_size == 300


def test_cli_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        _parse("data", "tokenize", "--input", "x.jsonl", "--tokenizer", "t", "--output-prefix", "o",
               "--txt-mode", "words")
    with pytest.raises(SystemExit):
        _parse("data")
    assert "invalid choice: 'words'" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["", "\n\n", '{"text": ""}\n'])
def test_no_text_fails_and_writes_nothing(tmp_path, tok_dir, capsys, content):
    from longboat.cli.main import main

    src = tmp_path / ("in.jsonl" if content.startswith("{") else "in.txt")
    src.write_text(content)
    assert main(["data", "tokenize", "--input", str(src), "--tokenizer", str(tok_dir), "--output-prefix",
                 str(tmp_path / "out"), "--workers", "1", "--txt-mode", "paragraph"]) == 2
    err = capsys.readouterr().err
    assert f"error: no text to tokenize in {src}" in err and "nothing was written" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [src.name]


# Outputs follow the export rule: an existing one is kept without --overwrite, an input is never written over.


def _cli(*argv: str) -> int:
    from longboat.cli.main import main

    return main(["data", *argv])


def _one_error(capsys, code: int, *fragments: str) -> None:
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err


def test_tokenize_keeps_an_existing_token_file_pair(tmp_path, tok_dir, capsys):
    src = _write_jsonl(tmp_path / "in.jsonl", ["one", "two"])
    out = tmp_path / "out"
    tokenize = ["tokenize", "--input", str(src), "--tokenizer", str(tok_dir), "--workers", "1"]
    assert _cli(*tokenize, "--output-prefix", str(out)) in (0, None)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("out.*")}
    src.write_text(json.dumps({"text": "three"}) + "\n")
    _one_error(capsys, _cli(*tokenize, "--output-prefix", str(out)), f"{out}.bin already exists; pass --overwrite")
    (tmp_path / "out.bin").unlink()  # either file of the pair is enough to refuse
    _one_error(capsys, _cli(*tokenize, "--output-prefix", f"{out}.bin"), f"{out}.idx already exists")
    assert not (tmp_path / "out.bin").exists() and (tmp_path / "out.idx").read_bytes() == before["out.idx"]
    assert _cli(*tokenize, "--output-prefix", str(out), "--overwrite", "--no-eod") in (0, None)
    assert _documents(out) == _expected(tok_dir, ["three"], eod=False)
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.bin", "out.idx"]  # no hidden sibling left


def test_tokenize_never_writes_over_its_input_or_into_a_directory_prefix(tmp_path, tok_dir, capsys):
    src = tmp_path / "notes.idx"  # a plain text file that happens to end in .idx
    src.write_text("mine\n")
    _one_error(capsys, _cli("tokenize", "--input", str(src), "--tokenizer", str(tok_dir), "--workers", "1",
                            "--output-prefix", str(tmp_path / "notes"), "--overwrite"),
               f"{src}: is an input of this command")
    assert src.read_text() == "mine\n"
    _one_error(capsys, _cli("tokenize", "--input", str(src), "--tokenizer", str(tok_dir),
                            "--output-prefix", f"{tmp_path}/"),
               "names a directory; give a file name prefix such as", f"{tmp_path}/corpus_text_document.bin")
    assert os.listdir(tmp_path) == ["notes.idx"]


def test_train_tokenizer_keeps_an_existing_tokenizer(tmp_path, tok_dir, capsys):
    out = tmp_path / "tok"
    shutil.copytree(tok_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    train = ["train-tokenizer", "--input", str(STDLIB / "textwrap.py"), "--vocab-size", "300", "--output", str(out)]
    _one_error(capsys, _cli(*train), f"{out} already exists and is not empty; pass --overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _cli(*train, "--overwrite") in (0, None)
    assert Tokenizer(out).vocab_size == 300 and sorted(os.listdir(tmp_path)) == ["tok"]
    (out / "corpus.txt").write_text((STDLIB / "textwrap.py").read_text())
    _one_error(capsys, _cli("train-tokenizer", "--input", str(out / "corpus.txt"), "--vocab-size", "300",
                            "--output", str(out), "--overwrite"),
               f"holds {out / 'corpus.txt'}, which this command reads")
    assert (out / "corpus.txt").is_file() and Tokenizer(out).vocab_size == 300
