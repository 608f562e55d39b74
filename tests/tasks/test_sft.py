"""The ``sft`` task: checks before work, truncation, mixing weights, held-out conversations, malformed sources,
loss normalisation, export assets, and an end-to-end run of the tiny config that trains, resumes and exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from longboat.config.base import ConfigError
from longboat.data.chat.sources import ChatDataError
from longboat.data.chat.template import ChatTemplateError
from longboat.data.labels import IGNORE_INDEX
from longboat.data.tokenizer import Tokenizer
from longboat.recipes import train
from longboat.recipes.config import load_run_config
from longboat.trainer.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "sft" / "tiny.yaml"
TOKENIZER = REPO / "tests" / "fixtures" / "sft" / "tokenizer"
# Absolute fixture paths: the config's own are relative to the repository root, where users run it.
SMALL = [f"data.tokenizer={TOKENIZER}", f"data.sources=[{TOKENIZER.parent / 'chat.jsonl'}]", "model.d_model=64",
         "model.ffn_dim=128", "train.threads=1", "train.tensorboard=false"]


# ChatML that opens with a fixed system turn: not the fixture tokenizer's own template.
TERSE = ("<|im_start|>system\nBe terse.<|im_end|>\n"
         "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat(i: int, words: int = 3) -> dict:
    return {"messages": [{"role": "user", "content": f"Count to {i}."},
                         {"role": "assistant", "content": " ".join(["one"] * words) + f" {i}"}]}


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def resolve(tmp_path, *overrides: str):
    return load_run_config(CONFIG, [f"run_dir={tmp_path / 'run'}", *SMALL, *overrides])


def build(tmp_path, *overrides: str, seed: int = 0):
    resolved = resolve(tmp_path, *overrides)
    resolved.task.check(resolved.model)
    return resolved.task.build(resolved.model, resolved.cfg.train, seed, 1)


def test_check_fails_before_work(tmp_path):
    def check(*overrides):
        resolved = resolve(tmp_path, *overrides)
        resolved.task.check(resolved.model)

    check()
    with pytest.raises(ConfigError, match="data.seq_len=256 exceeds model.max_seq_len=128"):
        check("data.seq_len=256")
    with pytest.raises(ConfigError, match="has 436 tokens, more than the model's embedding"):
        check("model.vocab_size=256")
    with pytest.raises(ConfigError, match=r"data.sources\[0\]: .*missing.jsonl: no such file"):
        check(f"data.sources=[{tmp_path / 'missing.jsonl'}]")
    with pytest.raises(ChatTemplateError, match="'llama3' writes <\\|begin_of_text\\|>"):
        check("data.chat_template=llama3")
    with pytest.raises(ConfigError, match="data.train_on"):
        check("data.train_on=everything")


def test_truncation_drops_or_truncates_long_samples(tmp_path):
    rows = [chat(i) for i in range(8)] + [chat(100 + i, words=80) for i in range(2)]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    base = [f"data.sources=[{path}]", "data.seq_len=64", "data.valid_fraction=0", "train.micro_batch_size=1"]
    dropped = build(tmp_path, *base)
    assert dropped.summary["train_samples"] == 8 and dropped.summary["dropped (too long)"] == 2
    kept = build(tmp_path, *base, "data.truncation=truncate")
    assert kept.summary["train_samples"] == 10 and kept.summary["truncated"] == 2
    assert max(int((kept.train[r]["segments"] > 0).sum()) for r in range(len(kept.train))) == 64
    with pytest.raises(ConfigError, match="no training sample fits data.seq_len=8 \\(10 dropped as too long"):
        build(tmp_path, f"data.sources=[{path}]", "data.seq_len=8", "data.valid_fraction=0")


def supervised_numbers(rows) -> list[int]:
    """The number each training conversation counts to, read back from the supervised tokens of every row."""
    tok = Tokenizer(TOKENIZER)
    found = []
    for r in range(len(rows)):
        row = rows[r]
        for k in range(1, int(row["segments"].max()) + 1):
            labels = row["labels"][row["segments"] == k]
            text = tok.decode(labels[labels != IGNORE_INDEX].tolist())
            found.append(int(text.split("<|im_end|>")[0].split()[-1]))
    return sorted(found)


def test_mixing_weights_repeat_and_subsample_each_source(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [chat(i) for i in range(10)])
    b = write_jsonl(tmp_path / "b.jsonl", [chat(100 + i) for i in range(10)])
    sources = f"data.sources=[{{path: {a}, weight: 2.5}}, {{path: {b}, weight: 0.3}}]"
    data = build(tmp_path, sources, "data.valid_fraction=0", seed=1)
    numbers = supervised_numbers(data.train)
    assert data.summary["train_samples"] == 25 + 3
    from_a = [n for n in numbers if n < 100]
    assert all(from_a.count(i) in (2, 3) for i in range(10)) and len(from_a) == 25
    from_b = [n for n in numbers if n >= 100]
    assert len(from_b) == len(set(from_b)) == 3
    assert supervised_numbers(build(tmp_path, sources, "data.valid_fraction=0", seed=1).train) == numbers
    draws = {tuple(supervised_numbers(build(tmp_path, sources, "data.valid_fraction=0", seed=s).train))
             for s in range(2, 6)}
    assert len(draws) > 1  # the draw follows the seed


@pytest.mark.parametrize("packing", [True, False])
def test_cached_sources_give_the_rows_of_encoding_in_memory(tmp_path, packing):
    a = write_jsonl(tmp_path / "a.jsonl", [chat(i, words=1 + i % 17) for i in range(60)] + ["{bad"])
    b = write_jsonl(tmp_path / "b.jsonl", [chat(100 + i, words=40) for i in range(30)])
    v = write_jsonl(tmp_path / "v.jsonl", [chat(500 + i) for i in range(6)])
    common = [f"data.sources=[{{path: {a}, weight: 2.5}}, {{path: {b}, weight: 0.4}}]", f"data.valid_sources=[{v}]",
              "data.valid_fraction=0.2", "data.max_malformed_fraction=0.05", "data.seq_len=48",
              "data.truncation=truncate", f"data.packing={str(packing).lower()}", "train.micro_batch_size=1"]
    runs = {}
    for cache in ("false", "true"):
        resolved = resolve(tmp_path, *common, f"data.cache={cache}", f"data.cache_dir={tmp_path / 'cache'}")
        runs[cache] = (resolved.task, resolved.task.build(resolved.model, resolved.cfg.train, 3, 1))
    (memory_task, memory), (cached_task, cached) = runs["false"], runs["true"]
    assert cached.summary["cache"].startswith(f"{tmp_path / 'cache'}: 0 read, 3 encoded")
    for key in ("train_samples", "train_rows", "valid_rows", "packing", "truncated"):
        assert cached.summary[key] == memory.summary[key]
    for split in ("train", "valid"):
        got, want = getattr(cached, split), getattr(memory, split)
        assert len(got) == len(want)
        for r in range(len(want)):
            assert all(torch.equal(got[r][k], want[r][k]) for k in want[r])
    # Turning the cache on or off is not a change of rows for a resumed run.
    assert torch.equal(cached_task.state_dict()["rows_fingerprint"], memory_task.state_dict()["rows_fingerprint"])


def test_held_out_conversations_never_train(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [chat(i) for i in range(20)])
    v = write_jsonl(tmp_path / "v.jsonl", [chat(500 + i) for i in range(4)])
    data = build(tmp_path, f"data.sources=[{a}]", f"data.valid_sources=[{v}]", "data.valid_fraction=0.25",
                 "train.micro_batch_size=1")
    train, valid = supervised_numbers(data.train), supervised_numbers(data.valid)
    assert len(train) == 15 and len(valid) == 5 + 4 and not set(train) & set(valid)
    assert set(range(500, 504)) <= set(valid)


def test_malformed_source_fails_the_run_with_counts(tmp_path):
    rows = [chat(i) for i in range(20)] + ['{"messages": [', {"messages": []}]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    with pytest.raises(ChatDataError, match=r"chat.jsonl: 2 of 22 rows are malformed .*unparsable line × 1 \(rows 21"):
        build(tmp_path, f"data.sources=[{path}]")
    data = build(tmp_path, f"data.sources=[{path}]", "data.max_malformed_fraction=0.1", "data.valid_fraction=0")
    assert data.summary["train_samples"] == 20


@pytest.mark.parametrize("normalization", ["tokens", "samples"])
@pytest.mark.parametrize("packing", [True, False])
def test_loss_counts_tokens_or_samples(tmp_path, normalization, packing):
    path = write_jsonl(tmp_path / "chat.jsonl", [chat(i, words=1 + 3 * i) for i in range(6)])
    resolved = resolve(tmp_path, f"data.sources=[{path}]", "data.valid_fraction=0", f"data.packing={packing}",
                       f"data.loss_normalization={normalization}", "train.micro_batch_size=1")
    data = resolved.task.build(resolved.model, resolved.cfg.train, 0, 1)
    assert len(data.train) < 6 if packing else len(data.train) == 6
    batch = {k: torch.stack([data.train[r][k] for r in range(len(data.train))]) for k in data.train[0]}
    out = data.loss_fn(resolved.spec.build(resolved.model), batch)
    supervised = int((batch["labels"] != IGNORE_INDEX).sum())
    assert int(out.count) == (supervised if normalization == "tokens" else 6)
    assert out.units == int((batch["segments"] > 0).sum())


def test_export_carries_a_template_that_is_not_the_tokenizers(tmp_path):
    transformers = pytest.importorskip("transformers")
    template = tmp_path / "terse.jinja"
    template.write_text(TERSE)
    own = resolve(tmp_path).task.export_assets()
    assert sorted(own) == ["tokenizer.json", "tokenizer_config.json"]
    assets = resolve(tmp_path, f"data.chat_template={template}").task.export_assets()
    out = tmp_path / "export"
    out.mkdir()
    for name, content in assets.items():
        (out / name).write_bytes(content if isinstance(content, bytes) else content.read_bytes())
    assert Tokenizer(out).chat_template == template.read_text()
    hf = transformers.AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "Hi"}]
    assert hf.apply_chat_template(messages, tokenize=False) == \
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.slow
def test_tiny_config_trains_resumes_and_exports(tmp_path):
    transformers = pytest.importorskip("transformers")
    steps = ["train.steps=24", "train.log_every=4", "train.eval_every=0", "checkpoint.every=12"]
    result = train.run(resolve(tmp_path, *steps))
    assert result.step == 24
    losses = [m["loss"] for m in read_metrics(tmp_path / "run")]
    assert losses[-1] < losses[0] - 0.5, losses
    resumed = train.run(resolve(tmp_path, *steps[1:], "train.steps=30", "checkpoint.export_hf=true"))
    assert resumed.step == 30
    assert [m["step"] for m in read_metrics(tmp_path / "run")][len(losses):] == [28, 30]  # went on from step 24
    export = tmp_path / "run" / "export"
    assert json.loads((export / "longboat_config.json").read_text())["task"] == "sft"
    messages = [{"role": "user", "content": "What is 2 plus 3?"}]
    for out in (export, tmp_path / "run" / "hf"):
        hf = transformers.AutoTokenizer.from_pretrained(out)
        assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
            "<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.slow
def test_exports_chat_with_the_template_the_run_trained_with(tmp_path):
    transformers = pytest.importorskip("transformers")
    template = tmp_path / "terse.jinja"
    template.write_text(TERSE)
    train.run(resolve(tmp_path, "train.steps=2", "train.eval_every=0", "checkpoint.export_hf=true",
                      f"data.chat_template={template}"))
    for out in (tmp_path / "run" / "export", tmp_path / "run" / "hf"):
        assert Tokenizer(out).chat_template == TERSE
        hf = transformers.AutoTokenizer.from_pretrained(out)
        assert hf.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False) == \
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        assert hf("Hi")["input_ids"] == transformers.AutoTokenizer.from_pretrained(TOKENIZER)("Hi")["input_ids"]


def test_resuming_on_other_rows_warns(tmp_path, capsys):
    a = write_jsonl(tmp_path / "a.jsonl", [chat(i) for i in range(12)])
    first = resolve(tmp_path, f"data.sources=[{a}]", "data.valid_fraction=0")
    first.task.build(first.model, first.cfg.train, 0, 1)
    state = first.task.state_dict()
    same = resolve(tmp_path, f"data.sources=[{a}]", "data.valid_fraction=0")
    same.task.build(same.model, same.cfg.train, 0, 1)
    same.task.load_state_dict(state)
    assert "warning" not in capsys.readouterr().out
    other = resolve(tmp_path, f"data.sources=[{a}]", "data.valid_fraction=0", "data.seq_len=64")
    other.task.build(other.model, other.cfg.train, 0, 1)
    other.task.load_state_dict(state)
    assert "training rows differ from those the checkpoint was trained on" in capsys.readouterr().out
