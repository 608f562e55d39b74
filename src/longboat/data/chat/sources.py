"""Conversations from files: jsonl, json, parquet and ``datasets.save_to_disk`` directories.

Three row forms are read, each normalised to a list of ``{"role", "content", ...}`` messages:

- OpenAI ``messages``: roles system/user/assistant/tool; ``tool_calls``, ``name``, ``tool_call_id`` and any other
  message keys are kept as they are for the template (keys whose value is null are dropped, so a columnar file,
  which gives every message every key, reads like the jsonl it came from). An assistant message with
  ``tool_calls`` may have null content, read as "". A row's ``tools`` (a list, or its JSON string) reach the
  template as ``tools``.
- ShareGPT ``conversations`` of ``{"from", "value"}``: human→user, gpt→assistant, system, tool/function/
  observation→tool.
- Alpaca ``instruction``, optional ``input`` (appended to the instruction after a blank line), ``output``,
  optional ``system``.

``format: auto`` tells them apart per row by their keys. A row that cannot be read is counted by reason with its
row number (1-based; the line number in jsonl) and skipped; :func:`check_malformed` fails a source whose
malformed fraction exceeds the limit.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

from longboat.errors import LongboatError
from longboat.utils.json_files import JSONTextError, loads, read_json_file

Format = Literal["auto", "messages", "sharegpt", "alpaca"]
Message = dict[str, Any]

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool", "function": "tool", "observation": "tool"}
FILE_TYPES = (".jsonl", ".json", ".parquet")
EXAMPLES_KEPT = 3


class ChatDataError(LongboatError, ValueError):
    """A conversation file is missing, unreadable, or holds too many malformed rows."""


class Malformed(Exception):
    """One row is not a conversation; ``reason`` is the counted category."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


@dataclass
class SourceReport:
    """What reading one source found: rows, and the malformed ones by reason with their first row numbers."""

    path: str
    rows: int = 0
    malformed: Counter = field(default_factory=Counter)
    examples: dict[str, list[int]] = field(default_factory=dict)
    first_example: str = ""  # one malformed row, shown when the source fails

    @property
    def n_malformed(self) -> int:
        return sum(self.malformed.values())

    def count(self, row: int, reason: str, raw: Any = None, detail: str = "") -> None:
        self.malformed[reason] += 1
        self.examples.setdefault(reason, [])
        if len(self.examples[reason]) < EXAMPLES_KEPT:
            self.examples[reason].append(row)
        if not self.first_example:
            shown = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, default=str)
            self.first_example = f"row {row} ({reason}{': ' + detail if detail else ''}): {shown[:300]}"

    def describe(self) -> str:
        """``reason × count (rows a, b, c)`` for each reason."""
        return "; ".join(f"{reason} × {n} (rows {', '.join(map(str, self.examples[reason]))}"
                         f"{', ...' if n > len(self.examples[reason]) else ''})"
                         for reason, n in self.malformed.most_common())


@dataclass
class Conversation:
    messages: list[Message]
    row: int  # where it came from in its source, for messages about it
    tools: list[dict] | None = None  # the row's tool definitions, for the template
    images: list = field(default_factory=list)  # the row's images in placeholder order (``data/chat/images.py``)


def check_source(path: str | Path, split: str | None = None) -> None:
    """Fail at once when ``path`` is not a readable conversation file or dataset directory (and split)."""
    path = Path(path)
    if path.is_dir():
        _arrow_files(path, split)
    elif not path.is_file():
        raise ChatDataError(f"{path}: no such file or dataset directory")
    elif path.suffix not in FILE_TYPES:
        raise ChatDataError(f"{path}: unknown file type '{path.suffix}'; expected one of {', '.join(FILE_TYPES)} "
                            "or a directory written by datasets' save_to_disk")


def read_conversations(path: str | Path, format: Format = "auto",
                       split: str | None = None) -> tuple[list[Conversation], SourceReport]:
    """Every well-formed conversation of one source, and the report of what was skipped."""
    check_source(path, split)
    report = SourceReport(str(path))
    conversations = []
    for row, raw in source_rows(Path(path), split, report):
        report.rows += 1
        try:
            conversations.append(Conversation(normalise(raw, format), row, row_tools(raw)))
        except Malformed as e:
            report.count(row, e.reason, raw, e.detail)
    return conversations, report


def check_malformed(report: SourceReport, max_fraction: float) -> None:
    """Fail when more than ``max_fraction`` of a source's rows are malformed (or it has no rows at all)."""
    if report.rows == 0:
        raise ChatDataError(f"{report.path}: holds no rows")
    if report.n_malformed > max_fraction * report.rows:
        raise ChatDataError(
            f"{report.path}: {report.n_malformed} of {report.rows} rows are malformed "
            f"({report.n_malformed / report.rows:.1%}, more than data.max_malformed_fraction={max_fraction}): "
            f"{report.describe()}; e.g. {report.first_example}"
        )


# ---- files ---------------------------------------------------------------------------------------------------
def source_rows(path: Path, split: str | None, report: SourceReport) -> Iterator[tuple[int, Any]]:
    """``(row number, raw row)`` of a source; an unparsable jsonl line is counted in ``report`` and skipped."""
    if path.is_dir():
        yield from enumerate(_read_arrow(path, split), start=1)
    elif path.suffix == ".jsonl":
        with path.open("rb") as f:  # bytes: a line that is not UTF-8 is one malformed row, not the file's end
            for line_no, line in enumerate(f, start=1):
                if line.strip():
                    yield from parse_line(line_no, line, report)
    elif path.suffix == ".json":
        data = read_json_file(path, ChatDataError)
        if not isinstance(data, list):
            raise ChatDataError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
        yield from enumerate(data, start=1)
    else:
        yield from enumerate(_read_parquet(path), start=1)


def parse_line(line_no: int, line: bytes, report: SourceReport) -> Iterator[tuple[int, Any]]:
    """The row of one non-blank jsonl line, or nothing when it is counted in ``report`` as unparsable."""
    try:
        yield line_no, loads(line)
    except JSONTextError as e:
        report.rows += 1
        report.count(line_no, "unparsable line", line.rstrip(b"\n").decode("utf-8", "replace"), e.reason)


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError variants for damaged files
        raise ChatDataError(f"{path}: not a readable parquet file: {e}") from None


def _arrow_files(path: Path, split: str | None) -> list[Path]:
    """The arrow files of a ``save_to_disk`` directory (a Dataset, or one split of a DatasetDict)."""
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in splits:
            raise ChatDataError(f"{path}: a dataset with splits {', '.join(splits)}; "
                                + ("name one as the source's split" if split is None else f"no split '{split}'"))
        path = path / split
    elif split is not None:
        raise ChatDataError(f"{path}: split '{split}' given, but this directory is a single dataset (no "
                            "dataset_dict.json); drop split")
    state = path / "state.json"
    if not state.is_file():
        raise ChatDataError(f"{path}: not a dataset directory written by save_to_disk (no state.json)")
    files = [path / f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise ChatDataError(f"{path}: state.json lists missing data files: {', '.join(missing) or 'none listed'}")
    return files


def _read_arrow(path: Path, split: str | None) -> Iterator[dict]:
    import pyarrow as pa

    for file in _arrow_files(path, split):
        try:
            with pa.memory_map(str(file)) as source:
                yield from pa.ipc.open_stream(source).read_all().to_pylist()
        except pa.ArrowInvalid as e:
            raise ChatDataError(f"{file}: not a readable arrow stream: {e}") from None


# ---- rows ----------------------------------------------------------------------------------------------------
def detect_format(row: dict) -> str:
    if "messages" in row:
        return "messages"
    if "conversations" in row:
        return "sharegpt"
    if "instruction" in row and "output" in row:
        return "alpaca"
    raise Malformed("missing fields", f"keys {sorted(row)}; expected messages, conversations or instruction+output")


def normalise(row: Any, format: Format = "auto") -> list[Message]:
    """The row's conversation as messages, or :class:`Malformed`."""
    if not isinstance(row, dict):
        raise Malformed("not an object", type(row).__name__)
    form = detect_format(row) if format == "auto" else format
    if form == "messages":
        messages = _openai(row)
    elif form == "sharegpt":
        messages = _sharegpt(row)
    else:
        messages = _alpaca(row)
    if not messages:
        raise Malformed("empty conversation")
    if not any(m["role"] == "assistant" for m in messages):
        raise Malformed("no assistant turn")
    return messages


def row_tools(row: dict) -> list[dict] | None:
    """A row's ``tools``: a list of definitions, or that list as a JSON string (as columnar files often hold it)."""
    tools = row.get("tools")
    if isinstance(tools, str):
        try:
            tools = loads(tools)
        except JSONTextError as e:
            raise Malformed("unparsable tools", e.reason) from None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise Malformed("unparsable tools", "expected a list of tool definitions")
    return tools or None


def _turns(row: dict, key: str) -> list:
    turns = row.get(key)
    if turns is None:
        raise Malformed("missing fields", f"no '{key}'")
    if not isinstance(turns, list):
        raise Malformed("missing fields", f"'{key}' is a {type(turns).__name__}, not a list")
    if not all(isinstance(t, dict) for t in turns):
        raise Malformed("missing fields", f"'{key}' holds a non-object")
    return turns


def normalise_messages(turns: Any) -> list[Message]:
    """A list of OpenAI-style messages, checked and normalised as a ``messages`` row's are; or :class:`Malformed`."""
    return _openai({"messages": turns})


def _openai(row: dict) -> list[Message]:
    out = []
    for m in _turns(row, "messages"):
        if "role" not in m:
            raise Malformed("missing fields", "a message without a role")
        if not isinstance(m["role"], str) or m["role"] not in ROLES:
            raise Malformed("unknown role", repr(m["role"]))
        message = {k: v for k, v in m.items() if v is not None}
        content = m.get("content")
        if content is None and m["role"] == "assistant" and m.get("tool_calls"):
            content = ""
        if not isinstance(content, str):
            raise Malformed("non-string content", type(content).__name__)
        out.append({**message, "content": content})
    return out


def _sharegpt(row: dict) -> list[Message]:
    out = []
    for m in _turns(row, "conversations"):
        if "from" not in m or "value" not in m:
            raise Malformed("missing fields", "a turn without 'from' and 'value'")
        if not isinstance(m["from"], str) or m["from"] not in SHAREGPT_ROLES:
            raise Malformed("unknown role", repr(m["from"]))
        if not isinstance(m["value"], str):
            raise Malformed("non-string content", type(m["value"]).__name__)
        out.append({"role": SHAREGPT_ROLES[m["from"]], "content": m["value"]})
    return out


def _alpaca(row: dict) -> list[Message]:
    fields = {k: row.get(k) for k in ("instruction", "input", "output", "system")}
    if fields["instruction"] is None or fields["output"] is None:
        raise Malformed("missing fields", "alpaca rows need 'instruction' and 'output'")
    if not all(isinstance(v, str) for v in fields.values() if v is not None):
        raise Malformed("non-string content")
    prompt = fields["instruction"] + (f"\n\n{fields['input']}" if fields["input"] else "")
    system = [{"role": "system", "content": fields["system"]}] if fields["system"] else []
    return system + [{"role": "user", "content": prompt}, {"role": "assistant", "content": fields["output"]}]
