"""The on-disk SFT cache: the same samples, reports and rows as encoding in memory; keyed by what they depend on;
never re-encoded while unchanged; a damaged cache rebuilt; one rank builds while another waits and maps it."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch.multiprocessing as tmp_mp

from longboat.data.chat import cache as chat_cache
from longboat.data.chat.builtin import resolve_chat_template
from longboat.data.chat.cache import EncodeSettings, encoded_source
from longboat.data.chat.packing import MappedArrays, mapped_rows, pack, pad
from longboat.data.chat.sources import read_conversations
from longboat.data.chat.supervision import ChatSupervisor, fit_samples
from longboat.data.tokenizer import Tokenizer
from tests.data.chat.conftest import CONVERSATIONS, TOOLS

MALFORMED = ["{not json", json.dumps({"messages": [{"role": "pirate", "content": "arr"}]}),
             json.dumps({"messages": [{"role": "user", "content": "no reply"}]})]


def rows(n: int) -> list[str]:
    """Conversations of varied lengths, tools in some, every 40th row malformed."""
    out = []
    for i in range(n):
        if i % 40 == 39:
            out.append(MALFORMED[(i // 40) % len(MALFORMED)])
            continue
        messages = [dict(m) for m in CONVERSATIONS[i % len(CONVERSATIONS)]]
        messages[-1] = {**messages[-1], "content": messages[-1]["content"] + " word" * (i % 23)}
        row = {"messages": messages, **({"tools": TOOLS} if i % 3 == 2 else {})}
        out.append(json.dumps(row))
    return out


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def settings(tokenizer, **kw) -> EncodeSettings:
    base = dict(chat_template=None, template_kwargs={}, train_on="assistant", history_rewrite="per_turn",
                seq_len=96, truncation="truncate")
    return EncodeSettings(str(tokenizer), **{**base, **kw})


def in_memory(path: str, s: EncodeSettings):
    """What ``sft`` encodes without the cache: (samples of each kept conversation, read report, full report)."""
    tok = Tokenizer(s.tokenizer)
    template, _ = resolve_chat_template(tok, s.chat_template)
    supervisor = ChatSupervisor(tok, template, s.template_kwargs, s.train_on, s.history_rewrite)
    conversations, report = read_conversations(path)
    read = json.loads(json.dumps(chat_cache.report_json(report)))
    encoded, stats = supervisor.encode(conversations, path)
    for i, why in stats.rejected.items():
        report.count(conversations[i].row, "rejected by template", conversations[i].messages, why)
    counts = Counter()
    kept = [fit_samples(encoded[i], s.seq_len, s.truncation == "truncate", counts)
            for i in range(len(conversations)) if i not in stats.rejected]
    return kept, read, report, counts


def build(path, s, cache_dir, workers=1):
    built = []
    enc = encoded_source(path, "auto", None, s, cache_dir, workers, on_build=built.append)
    return enc, len(built)


@pytest.mark.parametrize("name", ["qwen_tokenizer", "llama_tokenizer", "qwen3_tokenizer"])
def test_cached_samples_and_rows_equal_the_in_memory_ones(name, request, tmp_path):
    tokenizer = request.getfixturevalue(name)
    path = write(tmp_path / "chat.jsonl", rows(200))
    s = settings(tokenizer)
    enc, n_built = build(path, s, tmp_path / "cache")
    kept, read, report, counts = in_memory(path, s)
    assert n_built == 1 and enc.conversations == len(kept)
    flat = [sample for samples in kept for sample in samples]
    assert [enc.kept[j + 1] - enc.kept[j] for j in range(len(kept))] == [len(x) for x in kept]
    for i, sample in enumerate(flat):
        a, b = enc.starts[i], enc.starts[i + 1]
        np.testing.assert_array_equal(enc.tokens[a:b], sample.tokens)
        np.testing.assert_array_equal(enc.labels[a:b], sample.labels)
    assert chat_cache.report_json(enc.read_report) == read
    assert chat_cache.report_json(enc.report) == chat_cache.report_json(report) and report.n_malformed == 5
    assert {k: v for k, v in enc.counts.items() if k != "boundary merges"} == counts
    store = MappedArrays(enc.tokens, enc.labels, enc.starts)
    # Every sample, and some twice (a weighted source repeats conversations), packed and padded.
    index = np.concatenate([np.arange(len(flat)), np.arange(0, len(flat), 3)])
    chosen = [flat[i] for i in index]
    for packing, layout in ((True, pack), (False, pad)):
        memory = layout(chosen, s.seq_len, 0)
        mapped = mapped_rows([store], np.zeros(len(index), np.int64), index, s.seq_len, 0, packing)
        assert len(mapped) == len(memory) and mapped.efficiency == memory.efficiency
        for r in range(len(memory)):
            assert all((mapped[r][k] == memory[r][k]).all() for k in memory[r])
        assert b"".join(a.tobytes() for a in mapped.fingerprint_arrays()) == \
               b"".join(np.ascontiguousarray(a).tobytes() for a in memory.fingerprint_arrays())


# ChatML that refuses a conversation mentioning a kraken.
REFUSING = ("{% for m in messages %}{% if 'kraken' in m.content %}{{ raise_exception('no krakens') }}{% endif %}"
            "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_malformed_and_refused_rows_are_reported_and_fail_the_same(qwen_tokenizer, tmp_path):
    from longboat.data.chat.sources import ChatDataError, check_malformed

    lines = rows(80)
    for i in (5, 17, 18):
        lines[i] = json.dumps({"messages": [{"role": "user", "content": f"a kraken {i}"},
                                            {"role": "assistant", "content": "run"}]})
    path = write(tmp_path / "chat.jsonl", lines)
    (tmp_path / "refusing.jinja").write_text(REFUSING)
    s = settings(qwen_tokenizer, chat_template=str(tmp_path / "refusing.jinja"))
    enc, _ = build(path, s, tmp_path / "cache")
    again, n = build(path, s, tmp_path / "cache")
    _, _, report, _ = in_memory(path, s)
    assert n == 0 and report.malformed["rejected by template"] == 3
    for cached in (enc, again):
        assert chat_cache.report_json(cached.report) == chat_cache.report_json(report)
        assert cached.report.describe() == report.describe()
    for limit in (0.01, 0.05):  # the encoding run fails here on the full report, after the read one passed
        errors = []
        for r in (report, again.report):
            with pytest.raises(ChatDataError) as e:
                check_malformed(r, limit)
            errors.append(str(e.value))
        assert errors[0] == errors[1] and "rejected by template × 3 (rows 6, 18, 19)" in errors[0]
    check_malformed(again.report, 0.07)


def test_the_pool_encodes_what_one_process_does(qwen_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(chat_cache, "CHUNK_ROWS", 40)
    path = write(tmp_path / "chat.jsonl", rows(200))
    one, _ = build(path, settings(qwen_tokenizer), tmp_path / "one", workers=1)
    two, _ = build(path, settings(qwen_tokenizer), tmp_path / "two", workers=2)
    for name in ("tokens", "labels", "starts", "kept"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name))
    assert chat_cache.report_json(one.report) == chat_cache.report_json(two.report)
    assert one.counts == two.counts


def test_a_changed_source_tokenizer_or_template_makes_a_new_cache(qwen_tokenizer, tmp_path):
    path = write(tmp_path / "chat.jsonl", rows(50))
    cache = tmp_path / "cache"
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    for f in Path(qwen_tokenizer).iterdir():
        (tokenizer / f.name).write_bytes(f.read_bytes())
    s = settings(tokenizer)
    first, n = build(path, s, cache)
    assert n == 1
    again, n = build(path, s, cache)  # unchanged: mapped, never encoded
    assert n == 0 and again.directory == first.directory and again.built_s is None
    # Same size and modification time, one byte different: still a new cache.
    stat = os.stat(path)
    text = Path(path).read_text()
    Path(path).write_text(text.replace("longboat", "longbaot", 1))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert build(path, s, cache)[1] == 1
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    assert build(path, s, cache)[1] == 1
    assert build(path, settings(tokenizer, chat_template="chatml"), cache)[1] == 1
    assert build(path, settings(tokenizer, seq_len=64), cache)[1] == 1
    assert build(path, settings(tokenizer, train_on="all"), cache)[1] == 1
    assert len(list(cache.glob("sft-*"))) == 6
    assert build(path, s, cache)[1] == 0


@pytest.mark.parametrize("damage", ["truncate tokens", "drop meta", "garble starts"])
def test_a_damaged_cache_is_rebuilt(qwen_tokenizer, tmp_path, damage, capsys):
    path = write(tmp_path / "chat.jsonl", rows(50))
    s = settings(qwen_tokenizer)
    good, _ = build(path, s, tmp_path / "cache")
    directory = good.directory
    expected = np.array(good.tokens)
    if damage == "truncate tokens":
        with open(directory / "tokens.bin", "r+b") as f:
            f.truncate(os.path.getsize(directory / "tokens.bin") - 4)
    elif damage == "drop meta":
        (directory / "meta.json").unlink()
    else:
        (directory / "starts.npy").write_bytes(b"\x93NUMPY garbage")
    again, n = build(path, s, tmp_path / "cache")
    assert n == 1 and again.directory == directory
    np.testing.assert_array_equal(again.tokens, expected)
    assert "damaged SFT cache" in capsys.readouterr().err
    assert not [p for p in directory.parent.iterdir() if p.name.startswith(".")]  # nothing half-written left


def _rank(rank: int, path: str, s: EncodeSettings, cache: str, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        if rank != 0:  # as the training recipe does: local rank 0 builds shared caches first
            dist.barrier()
        enc, n_built = build(path, s, cache)
        if rank == 0:
            dist.barrier()
        Path(out, f"rank{rank}.json").write_text(json.dumps(
            {"built": n_built, "mapped": isinstance(enc.tokens, np.memmap), "tokens": int(enc.tokens.sum())}))
    finally:
        dist.destroy_process_group()


def test_rank_zero_builds_and_the_other_rank_maps(qwen_tokenizer, tmp_path):
    path = write(tmp_path / "chat.jsonl", rows(60))
    init = f"file://{tmp_path / 'rendezvous'}"
    tmp_mp.spawn(_rank, args=(path, settings(qwen_tokenizer), str(tmp_path / "cache"), init, str(tmp_path)),
                 nprocs=2, join=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [g["built"] for g in got] == [1, 0] and all(g["mapped"] for g in got)
    assert got[0]["tokens"] == got[1]["tokens"]
    assert len(list((tmp_path / "cache").glob("sft-*"))) == 1


def test_mapped_rows_reach_loader_workers_as_file_names(qwen_tokenizer, tmp_path):
    import pickle

    enc, _ = build(write(tmp_path / "chat.jsonl", rows(60)), settings(qwen_tokenizer), tmp_path / "cache")
    index = np.arange(len(enc.starts) - 1)
    mapped = mapped_rows([MappedArrays(enc.tokens, enc.labels, enc.starts)], np.zeros(len(index), np.int64), index,
                         96, 0)
    data = pickle.dumps(mapped)
    assert len(data) < enc.tokens.nbytes  # the tokens stay in their file
    back = pickle.loads(data)
    assert isinstance(back.stores[0].tokens, np.memmap)
    for r in range(len(mapped)):
        assert all((back[r][k] == mapped[r][k]).all() for k in mapped[r])
