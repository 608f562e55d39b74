"""Random values in LeRobot metadata (info.json, features, statistics, episode and task rows) through
``data info``, ``data info --check`` and ``train --check`` of a policy on the dataset: each example ends in
success or in exit 2 with one ``error:`` line, never a traceback."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longboat.cli.main import main
from tests.data.robot.lerobot_edit import (INFO, V3_EPISODES, V21_EPISODES, V21_EPISODES_STATS, V21_TASKS, column,
                                           copy_fixture, jsonl_rows, read_info, set_column, write_jsonl)

REPO = Path(__file__).resolve().parents[3]
POLICY = REPO / "configs" / "policy" / "mlp_tiny.yaml"  # state only: no video decoded
CAMERA = "observation.images.cam"
DELETE = object()  # the key removed rather than set

TEXT = st.sampled_from(["", "10", "-1", "nan", "1e999", "v3.0", "v2.1", "float32", "int64", "video", "image", "string",
                        "{chunk_index}", "data/{file_index:03d}.parquet", "{}", "{video_key!r}", "../{chunk_index}",
                        "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", "é\x00"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.just(10**400),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), TEXT)
JSON = st.one_of(SCALARS, st.just(DELETE), st.recursive(
    SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner,
                                                                                   max_size=3)), max_leaves=8))
# What a parquet column can hold: a scalar of one type, or a list of them (the whole column takes the value).
PARQUET = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), TEXT,
                    st.lists(st.integers(-5, 100), max_size=3), st.lists(TEXT, max_size=3))

INFO_KEYS = ["fps", "total_episodes", "total_frames", "total_tasks", "total_chunks", "chunks_size", "data_path",
             "video_path", "codebase_version", "features", "robot_type", "splits"]
FEATURES = ["action", "observation.state", CAMERA, "timestamp", "episode_index", "task_index"]
FEATURE_FIELDS = ["dtype", "shape", "names", "info"]
STATS = [("action", s) for s in ("mean", "std", "min", "max", "count", "q01")] + [(CAMERA, "mean"), (CAMERA, "std")]
V3_COLUMNS = ["episode_index", "length", "dataset_from_index", "dataset_to_index", "data/chunk_index",
              "data/file_index", f"videos/{CAMERA}/from_timestamp", f"videos/{CAMERA}/file_index", "tasks"]
V21_ROWS = [(V21_EPISODES, k) for k in ("episode_index", "length", "tasks")] + [(V21_TASKS, "task_index"),
                                                                                 (V21_TASKS, "task")]


def _set(mapping: dict, key: str, value) -> None:
    if value is DELETE:
        mapping.pop(key, None)
    else:
        mapping[key] = value


@st.composite
def mutations(draw, version: str):
    """(description, function that applies it to a copy of the fixture)."""
    kinds = ["info", "feature", "stats", "v3_episodes" if version == "v30" else "v21_rows"]
    kind = draw(st.sampled_from(kinds))
    row = draw(st.integers(0, 2))
    if kind == "info":
        key, value = draw(st.sampled_from(INFO_KEYS)), draw(JSON)

        def apply(root):
            info = read_info(root)
            _set(info, key, value)
            (root / INFO).write_text(json.dumps(info))
        return f"info.json {key} = {value!r}", apply
    if kind == "feature":
        name, field, value = draw(st.sampled_from(FEATURES)), draw(st.sampled_from(FEATURE_FIELDS)), draw(JSON)

        def apply(root):
            info = read_info(root)
            _set(info["features"][name], field, value)
            (root / INFO).write_text(json.dumps(info))
        return f"features.{name}.{field} = {value!r}", apply
    if kind == "stats":
        (name, stat), value = draw(st.sampled_from(STATS)), draw(JSON)

        def apply(root):
            if version == "v30":
                stats = json.loads((root / "meta/stats.json").read_text())
                _set(stats[name], stat, value)
                (root / "meta/stats.json").write_text(json.dumps(stats))
            else:
                rows = jsonl_rows(root / V21_EPISODES_STATS)
                _set(rows[row]["stats"][name], stat, value)
                write_jsonl(root / V21_EPISODES_STATS, rows)
        return f"stats {name}.{stat} = {value!r} (row {row})", apply
    if kind == "v3_episodes":
        name, value = draw(st.sampled_from(V3_COLUMNS)), draw(PARQUET)

        def apply(root):
            values = column(root / V3_EPISODES, name)
            values[row] = value
            try:
                array = pa.array(values)  # one row changed, when its type mixes with the others
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                array = pa.array([value] * len(values))
            set_column(root / V3_EPISODES, name, array)
        return f"episodes parquet {name}[{row}] = {value!r}", apply
    (path, key), value = draw(st.sampled_from(V21_ROWS)), draw(JSON)

    def apply(root):
        rows = jsonl_rows(root / path)
        _set(rows[min(row, len(rows) - 1)], key, value)
        write_jsonl(root / path, rows)
    return f"{path} row {row} {key} = {value!r}", apply


def ends_cleanly(args: list[str], capsys, what: str) -> None:
    code = main(args)
    err = capsys.readouterr().err
    assert code in (None, 0, 2), (what, args, code, err)
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1 and err.count("error:") == 1, (what, args, err)
    else:
        assert "error:" not in err, (what, args, err)


@pytest.mark.parametrize("version", ["v30", "v21"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_metadata_value_ends_cleanly(version, data, capsys):
    what, apply = data.draw(mutations(version))
    with tempfile.TemporaryDirectory() as tmp:
        root = copy_fixture(version, Path(tmp) / "ds")
        apply(root)
        ends_cleanly(["data", "info", str(root)], capsys, what)
        ends_cleanly(["data", "info", str(root), "--check"], capsys, what)
        ends_cleanly(["train", str(POLICY), f"data.path={root}", f"run_dir={tmp}/run", "--check"], capsys, what)
