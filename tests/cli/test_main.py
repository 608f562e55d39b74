"""The command line end to end: train → checkpoints → export → generate, and bad input that fails clearly."""

import json
import math
import shutil

import pytest

from longboat.data.indexed import IndexedDatasetWriter
from longboat.trainer.metrics import read_metrics
from tests.conftest import run_longboat, tiny_run_args

pytestmark = pytest.mark.slow


def assert_clean_failure(proc, *fragments: str):
    """Exit code 2, one error message naming the problem, no traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for f in fragments:
        assert f in proc.stderr, f"{f!r} not in:\n{proc.stderr}"


def test_train_export_generate(corpus, tmp_path):
    run = tmp_path / "run"
    proc = run_longboat(*tiny_run_args(run, corpus, "train.steps=6", "checkpoint.every=3"), check=True)
    assert (run / "config.yaml").is_file() and (run / "provenance.json").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000003", "step_00000006"]
    meta = json.loads((run / "export" / "longboat_config.json").read_text())
    assert meta["arch"] == "decoder" and meta["model"]["n_layers"] == 2
    assert (run / "export" / "model.safetensors").is_file() and (run / "export" / "tokenizer.json").is_file()
    assert "exported to" in proc.stdout
    assert meta["task"] == "pretrain" and meta["ema"] is False and "tokenizer.json" in meta["assets"]
    valid = read_metrics(run, "valid")[-1]
    assert valid["perplexity"] == pytest.approx(math.exp(valid["loss"]))
    assert "tokens_per_s" in read_metrics(run)[0]

    from_export = run_longboat("generate", str(run), "--prompt", "def ", "--max-new-tokens", "8",
                               "--temperature", "0", check=True)
    from_ckpt = run_longboat("generate", str(run / "checkpoints" / "step_00000006"), "--prompt", "def ",
                             "--max-new-tokens", "8", "--temperature", "0", check=True)
    assert from_export.stdout.startswith("def ") and from_export.stdout == from_ckpt.stdout

    out = tmp_path / "exp3"
    run_longboat("export", str(run / "checkpoints" / "step_00000003"), "--output", str(out), check=True)
    from_step3 = run_longboat("generate", str(out), "--prompt", "def ", "--max-new-tokens", "8",
                              "--temperature", "0", check=True)
    assert from_step3.stdout.startswith("def ")


def test_config_typo(corpus, tmp_path):
    proc = run_longboat(*tiny_run_args(tmp_path, corpus, "train.optimizer.lrr=1e-3"))
    assert_clean_failure(proc, "unknown key 'train.optimizer.lrr'", "did you mean 'lr'")
    assert not (tmp_path / "checkpoints").exists()


def test_missing_token_files(corpus, tmp_path):
    proc = run_longboat(*tiny_run_args(tmp_path, corpus, f"data.paths=[{tmp_path}/nothing]"))
    assert_clean_failure(proc, "data.paths", "nothing")


def test_truncated_index(corpus, tmp_path):
    prefix = tmp_path / "broken"
    shutil.copy(corpus[1] + ".bin", f"{prefix}.bin")
    data = open(corpus[1] + ".idx", "rb").read()
    open(f"{prefix}.idx", "wb").write(data[:-16])
    proc = run_longboat(*tiny_run_args(tmp_path / "run", corpus, f"data.paths=[{prefix}]"))
    assert_clean_failure(proc, "broken.idx", "truncated")


def test_foreign_index(corpus, tmp_path):
    prefix = tmp_path / "foreign"
    shutil.copy(corpus[1] + ".bin", f"{prefix}.bin")
    open(f"{prefix}.idx", "wb").write(b"NOTMEGATRON" + bytes(64))
    proc = run_longboat(*tiny_run_args(tmp_path / "run", corpus, f"data.paths=[{prefix}]"))
    assert_clean_failure(proc, "foreign.idx", "magic")


def test_bin_that_does_not_match(corpus, tmp_path):
    prefix = tmp_path / "mismatch"
    shutil.copy(corpus[1] + ".idx", f"{prefix}.idx")
    open(f"{prefix}.bin", "wb").write(b"\0" * 10)
    proc = run_longboat(*tiny_run_args(tmp_path / "run", corpus, f"data.paths=[{prefix}]"))
    assert_clean_failure(proc, "mismatch.bin", "does not match")


def test_tokenizer_larger_than_embedding(corpus, tmp_path):
    proc = run_longboat(*tiny_run_args(tmp_path, corpus, "model.vocab_size=100"))
    assert_clean_failure(proc, "data.tokenizer", "512 tokens", "model.vocab_size=100")


def test_sequence_length_the_data_cannot_fill(corpus, tmp_path):
    prefix = tmp_path / "short"
    with IndexedDatasetWriter(prefix) as w:
        w.add_document([1, 2, 3, 0])
        w.add_document([4, 5, 0])
    proc = run_longboat(*tiny_run_args(tmp_path / "run", corpus, f"data.paths=[{prefix}]", "data.split=1,0,0"))
    assert_clean_failure(proc, "short")


def test_missing_config_file(tmp_path):
    assert_clean_failure(run_longboat("train", str(tmp_path / "nope.yaml")), "nope.yaml", "not found")


def test_generate_from_nothing(tmp_path):
    assert_clean_failure(run_longboat("generate", str(tmp_path / "nope")), "nope")
