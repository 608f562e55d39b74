"""Conversation sources: every row form in every file type reads to the same messages; malformed rows are counted
by reason and a source with too many fails naming the file, the counts and an example."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longboat.data.chat.sources import ChatDataError, check_malformed, check_source, normalise, read_conversations

OPENAI = {"messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Tide in Bergen?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_tide", "arguments": {"harbour": "Bergen"}}}]},
    {"role": "tool", "content": "14:32", "name": "get_tide", "tool_call_id": "call_1"},
    {"role": "assistant", "content": "At 14:32."},
]}
SHAREGPT = {"conversations": [
    {"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Ahoy."},
    {"from": "human", "value": "Tide?"}, {"from": "observation", "value": "14:32"},
    {"from": "gpt", "value": "At 14:32."},
]}
ALPACA = {"instruction": "Name a knot.", "input": "One used at sea.", "output": "The bowline.", "system": "Be brief."}

EXPECTED = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tide in Bergen?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_tide", "arguments": {"harbour": "Bergen"}}}]},
        {"role": "tool", "content": "14:32", "name": "get_tide", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "At 14:32."},
    ],
    "sharegpt": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Ahoy."}, {"role": "user", "content": "Tide?"},
        {"role": "tool", "content": "14:32"}, {"role": "assistant", "content": "At 14:32."},
    ],
    "alpaca": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a knot.\n\nOne used at sea."},
        {"role": "assistant", "content": "The bowline."},
    ],
}
ROWS = {"messages": OPENAI, "sharegpt": SHAREGPT, "alpaca": ALPACA}


def write(path, rows: list[dict], kind: str):
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path.write_text(json.dumps(rows))
    elif kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif kind == "dataset":
        datasets = pytest.importorskip("datasets")
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "dataset"])
@pytest.mark.parametrize("form", ["messages", "sharegpt", "alpaca"])
@pytest.mark.parametrize("declared", ["auto", "named"])
def test_every_form_in_every_file_type(tmp_path, kind, form, declared):
    path = write(tmp_path / f"chat.{kind}", [ROWS[form]] * 3, kind)
    conversations, report = read_conversations(path, "auto" if declared == "auto" else form)
    assert report.rows == 3 and report.n_malformed == 0
    assert [c.messages for c in conversations] == [EXPECTED[form]] * 3
    assert [c.row for c in conversations] == [1, 2, 3]


def test_dataset_dict_takes_the_named_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list([ALPACA] * 3),
                          "test": datasets.Dataset.from_list([SHAREGPT])}).save_to_disk(str(tmp_path / "d"))
    train, _ = read_conversations(tmp_path / "d", split="train")
    test, _ = read_conversations(tmp_path / "d", split="test")
    assert len(train) == 3 and [c.messages for c in test] == [EXPECTED["sharegpt"]]
    with pytest.raises(ChatDataError, match="splits train, test; name one"):
        check_source(tmp_path / "d")
    with pytest.raises(ChatDataError, match="no split 'valid'"):
        check_source(tmp_path / "d", "valid")


def test_missing_and_unknown_files(tmp_path):
    with pytest.raises(ChatDataError, match="no such file"):
        check_source(tmp_path / "nope.jsonl")
    (tmp_path / "chat.csv").write_text("a,b\n")
    with pytest.raises(ChatDataError, match=r"unknown file type '\.csv'"):
        check_source(tmp_path / "chat.csv")
    (tmp_path / "dir").mkdir()
    with pytest.raises(ChatDataError, match="no state.json"):
        check_source(tmp_path / "dir")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ChatDataError, match="not valid JSON"):
        read_conversations(tmp_path / "bad.json")


MALFORMED = [
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}]}', "unknown role"),
    ('{"messages": []}', "empty conversation"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant turn"),
    ('{"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}]}', "non-string content"),
    ('{"text": "no conversation here"}', "missing fields"),
    ('{"conversations": [{"from": "human"}]}', "missing fields"),
    ('{"conversations": [{"from": ["alien"], "value": "x"}]}', "unknown role"),
    ('{"instruction": "x"}', "missing fields"),
    ('{"messages": [{"role": "user"', "unparsable line"),
    ('[1, 2]', "not an object"),
]


def test_malformed_rows_are_counted_by_reason_with_row_numbers(tmp_path):
    good = json.dumps(OPENAI)
    lines = [good] * 3 + [line for line, _ in MALFORMED] + ["", good]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(lines) + "\n")
    conversations, report = read_conversations(path)
    assert len(conversations) == 4 and report.rows == 4 + len(MALFORMED)
    assert report.malformed == {"unknown role": 2, "empty conversation": 1, "no assistant turn": 1,
                                "non-string content": 1, "missing fields": 3, "unparsable line": 1,
                                "not an object": 1}
    assert report.examples["unknown role"] == [4, 10] and report.examples["unparsable line"] == [12]
    assert conversations[-1].row == 15  # a blank line is skipped, yet counted in line numbers
    check_malformed(report, 0.8)
    with pytest.raises(ChatDataError) as e:
        check_malformed(report, 0.5)
    message = str(e.value)
    assert str(path) in message and "10 of 14 rows are malformed" in message
    assert "missing fields × 3 (rows 8, 9, 11)" in message and "e.g. row 4 (unknown role: 'wizard')" in message


def test_malformed_fraction_is_a_strict_limit(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(OPENAI) + "\n" + '{"messages": []}\n')
    _, report = read_conversations(path)
    check_malformed(report, 0.5)  # exactly at the limit passes
    with pytest.raises(ChatDataError, match="1 of 2 rows"):
        check_malformed(report, 0.49)
    path.write_text("")
    with pytest.raises(ChatDataError, match="holds no rows"):
        check_malformed(read_conversations(path)[1], 0.5)


def test_named_format_refuses_other_forms():
    with pytest.raises(Exception, match="missing fields"):
        normalise(ALPACA, "messages")


TOOL = {"type": "function", "function": {"name": "get_tide", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_row_tools_are_read_as_a_list_or_its_json_string(tmp_path, kind):
    rows = [{**OPENAI, "tools": json.dumps([TOOL])}, {**OPENAI, "tools": json.dumps([TOOL])},
            {**OPENAI, "tools": "[{"}, {**OPENAI, "tools": "{}"}]
    conversations, report = read_conversations(write(tmp_path / f"chat.{kind}", rows, kind))
    assert [c.tools for c in conversations] == [[TOOL], [TOOL]]
    assert report.malformed == {"unparsable tools": 2}
    listed = write(tmp_path / "list.jsonl", [{**OPENAI, "tools": [TOOL]}, OPENAI], "jsonl")
    conversations, _ = read_conversations(listed)
    assert [c.tools for c in conversations] == [[TOOL], None]


def test_lines_that_are_not_utf8_or_nest_too_deep_are_unparsable_rows(tmp_path):
    """Such lines raised UnicodeDecodeError (ending the file) and RecursionError: tracebacks. Now each is one
    malformed row, named by its line."""
    good = json.dumps(OPENAI).encode()
    path = tmp_path / "chat.jsonl"
    path.write_bytes(b"\n".join([good, b'{"messages": "caf\xe9"}', b"[" * 100_000, good]) + b"\n")
    conversations, report = read_conversations(path)
    assert [c.row for c in conversations] == [1, 4]
    assert report.malformed == {"unparsable line": 2} and report.examples["unparsable line"] == [2, 3]
    with pytest.raises(ChatDataError, match=r"chat\.jsonl: 2 of 4 rows are malformed .*\(rows 2, 3\); e\.g\. row 2 "
                                            r"\(unparsable line: not UTF-8 text \(byte 0xe9"):
        check_malformed(report, 0.1)


@pytest.mark.parametrize("content, message", [
    (b'[{"messages": "caf\xe9"}]', r"bad\.json:1: not UTF-8 text \(byte 0xe9 at offset 18\)"),
    (b"[" * 100_000, r"bad\.json: JSON nested too deeply to read"),
    (b'[\n{"a": }]', r"bad\.json:2: not valid JSON \(Expecting value at column 7\)"),
])
def test_a_json_file_that_cannot_be_read_is_named_with_its_line(tmp_path, content, message):
    (tmp_path / "bad.json").write_bytes(content)
    with pytest.raises(ChatDataError, match=message):
        read_conversations(tmp_path / "bad.json")
