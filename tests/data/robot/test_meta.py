"""Metadata checked when a dataset is opened: each wrong value, count or range is one RobotDataError line that
names the file, the key or row, and what was expected."""

import json
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longboat.data.robot import DatasetMeta, RobotDataError, RobotDataset
from tests.data.robot.lerobot_edit import (INFO, V3_DATA, V3_EPISODES, V21_EPISODES, V21_EPISODES_STATS, V21_TASKS,
                                           column, copy_fixture, edit_info, jsonl_rows, read_info, set_column,
                                           write_jsonl)


@pytest.fixture
def v30(tmp_path) -> Path:
    return copy_fixture("v30", tmp_path / "v30")


@pytest.fixture
def v21(tmp_path) -> Path:
    return copy_fixture("v21", tmp_path / "v21")


def fails(root: Path, *fragments: str) -> str:
    with pytest.raises(RobotDataError) as info:
        DatasetMeta(root)
    message = str(info.value)
    assert "\n" not in message, message
    for f in fragments:
        assert f in message, f"{f!r} not in {message!r}"
    return message


@pytest.mark.parametrize("fps", [math.nan, math.inf, -math.inf, True, 10**400])
def test_fps_must_be_a_finite_positive_number(v30, fps):
    """NaN passed ``fps <= 0`` and padded every window of a whole training run."""
    (v30 / INFO).write_text(json.dumps({**read_info(v30), "fps": fps}))
    fails(v30, str(v30 / INFO), "'fps': expected a finite positive number")
    edit_info(v30, fps=7.5)  # LeRobot writes integers; a fraction is a rate all the same
    assert DatasetMeta(v30).fps == 7.5


def test_an_episode_listed_twice_in_two_v30_files_is_refused(v30):
    """The second row of an episode replaced another silently: one episode was lost."""
    rows = pq.read_table(v30 / V3_EPISODES)
    pq.write_table(rows.slice(0, 2), v30 / V3_EPISODES)
    again = rows.slice(1, 1)  # episode 1 once more, in a second file, where episode 2 was
    pq.write_table(again, v30 / "meta/episodes/chunk-000/file-001.parquet")
    edit_info(v30, total_episodes=3)
    fails(v30, "episode_index 1 is listed 2 times in the episode metadata",
          f"{v30 / V3_EPISODES} row 1", f"{v30 / 'meta/episodes/chunk-000/file-001.parquet'} row 0")


def test_an_episode_listed_twice_in_v21_is_refused(v21):
    rows = jsonl_rows(v21 / V21_EPISODES)
    write_jsonl(v21 / V21_EPISODES, [rows[0], rows[1], {**rows[2], "episode_index": 1}])
    fails(v21, "episode_index 1 is listed 2 times", f"{v21 / V21_EPISODES}:2", f"{v21 / V21_EPISODES}:3")


def test_total_frames_must_match_the_episode_lengths(v30):
    edit_info(v30, total_frames=80)
    fails(v30, str(v30 / INFO), "total_frames is 80", "add up to 74")


def test_total_tasks_must_match_the_tasks(v21):
    edit_info(v21, total_tasks=3)
    fails(v21, "total_tasks is 3", "tasks.jsonl lists 2")


def test_v21_total_chunks_must_count_the_chunks(v21):
    edit_info(v21, total_chunks=2)
    fails(v21, "total_chunks is 2", "fill 1")


def test_lengths_that_the_data_file_does_not_hold_are_refused_v21(v21):
    """The metadata says 34 frames; the file holds 30: ``data info`` reported 78 frames."""
    rows = jsonl_rows(v21 / V21_EPISODES)
    rows[1]["length"] = 34
    write_jsonl(v21 / V21_EPISODES, rows)
    edit_info(v21, total_frames=78)
    fails(v21, str(v21 / "data/chunk-000/episode_000001.parquet"), "holds 30 rows", "puts 34 in it", "episode 1")


def test_lengths_that_the_data_file_does_not_hold_are_refused_v30(v30):
    set_column(v30 / V3_EPISODES, "length", [24, 30, 25])
    set_column(v30 / V3_EPISODES, "dataset_to_index", [24, 54, 79])
    edit_info(v30, total_frames=79)
    fails(v30, str(v30 / V3_DATA), "holds 74 rows", "puts 79 in it", "episodes 0, 1, 2")


def test_frame_ranges_must_agree_with_the_lengths(v30):
    set_column(v30 / V3_EPISODES, "dataset_to_index", [25, 54, 74])
    fails(v30, f"{v30 / V3_EPISODES} row 0 (episode 0)", "0..25 (25 frames) but length is 24")


def test_frame_ranges_must_not_overlap(v30):
    set_column(v30 / V3_EPISODES, "dataset_from_index", [0, 20, 54])
    set_column(v30 / V3_EPISODES, "dataset_to_index", [24, 50, 74])
    fails(v30, "episodes 0 and 1 overlap", "0..24 and 20..50")


def test_a_file_index_beyond_the_chunk_size_is_refused(v30):
    edit_info(v30, chunks_size=1)
    set_column(v30 / V3_EPISODES, "data/file_index", [0, 0, 1])
    fails(v30, f"{v30 / V3_EPISODES} row 2 (episode 2)", "'data/file_index' is 1", "holds 1 files")


@pytest.mark.parametrize("name", [INFO, "meta/stats.json", V21_TASKS, V21_EPISODES, V21_EPISODES_STATS])
def test_metadata_that_is_not_utf8_is_named(v21, name):
    if name == "meta/stats.json":
        shutil.copy(v21 / INFO, v21 / name)  # v2.1 may carry an aggregated stats.json too
    (v21 / name).write_bytes(b'{"a": "\xff"}\n')
    fails(v21, str(v21 / name), "not UTF-8 text (byte 0xff at offset 7)")


@pytest.mark.parametrize("key, value, message", [
    ("total_episodes", "3", "'total_episodes': expected an integer, got '3'"),
    ("total_frames", -74, "'total_frames': expected an integer >= 0, got -74"),
    ("total_frames", 74.0, "'total_frames': expected an integer, got 74.0"),
    ("chunks_size", 0, "'chunks_size': expected an integer >= 1, got 0"),
    ("data_path", 5, "'data_path': expected a path template with {chunk_index}, {file_index}, got 5"),
    ("data_path", "data/{episode}.parquet", "unknown placeholder {episode} in 'data/{episode}.parquet'"),
    ("data_path", "data/{chunk_index}/{file_index:>999}.parquet", "has an unsupported format ':>999'"),
    ("data_path", "data/{chunk_index.real}.parquet", "unknown placeholder {chunk_index.real}"),
    ("data_path", "data/{chunk_index", "is not a valid path template"),
    ("data_path", "../../{chunk_index}/{file_index}.parquet", "must be a path inside the dataset directory"),
    ("video_path", "videos/{video_key}/{episode_index}.mp4", "'video_path': unknown placeholder {episode_index}"),
    ("video_path", "videos/{video_key!r}/{chunk_index}.mp4", "unsupported format '!r'"),
])
def test_wrongly_typed_info_values_are_named(v30, key, value, message):
    edit_info(v30, **{key: value})
    fails(v30, str(v30 / INFO), message)


@pytest.mark.parametrize("feature, change, message", [
    ("action", {"shape": [True]}, "features.action.shape: expected a list of positive integers"),
    ("action", {"shape": []}, "features.action.shape: expected a list of positive integers"),
    ("action", {"dtype": 5}, "features.action.dtype: expected a dtype name, got 5"),
    ("action", {"dtype": "object"}, "features.action.dtype: unknown dtype 'object'"),
    ("action", {"dtype": "float32,float32"}, "features.action.dtype: unknown dtype"),
    ("action", {"info": [1, 2]}, "features.action.info: expected a mapping, got [1, 2]"),
    ("task_index", {"dtype": "float32"}, "features.task_index: expected an integer dtype of shape [1]"),
    ("timestamp", {"shape": [2]}, "features.timestamp: expected a float dtype of shape [1]"),
])
def test_wrongly_typed_features_are_named(v30, feature, change, message):
    info = read_info(v30)
    info["features"][feature].update(change)
    edit_info(v30, features=info["features"])
    fails(v30, str(v30 / INFO), message)


def test_a_missing_frame_column_feature_is_named(v30):
    features = read_info(v30)["features"]
    del features["episode_index"]
    edit_info(v30, features=features)
    fails(v30, "features: 'episode_index' is missing")


@pytest.mark.parametrize("rows, message", [
    ([{"task_index": "0", "task": "a"}, {"task_index": 1, "task": "b"}], ":1: 'task_index': expected an integer"),
    ([{"task_index": 0, "task": 7}, {"task_index": 1, "task": "b"}], ":1: 'task': expected a string, got 7"),
    ([{"task_index": 0, "task": "a"}, {"task_index": 0, "task": "b"}], "task_index 0 is listed twice"),
    ([[0, "a"], {"task_index": 1, "task": "b"}], ":1: expected a JSON object, got [0, 'a']"),
])
def test_wrongly_typed_v21_tasks_are_named(v21, rows, message):
    write_jsonl(v21 / V21_TASKS, rows)
    fails(v21, str(v21 / V21_TASKS), message)


def test_a_v30_task_index_of_strings_is_named(v30):
    set_column(v30 / "meta/tasks.parquet", "task_index", ["0", "1"])
    fails(v30, str(v30 / "meta/tasks.parquet"), "column 'task_index' holds strings, expected integers")


@pytest.mark.parametrize("change, message", [
    ({"length": "24"}, ":1: 'length': expected an integer, got '24'"),
    ({"length": 0}, ":1: 'length': expected an integer >= 1, got 0"),
    ({"episode_index": -1}, ":1: 'episode_index': expected an integer >= 0, got -1"),
    ({"episode_index": 0.0}, ":1: 'episode_index': expected an integer, got 0.0"),
    ({"episode_index": 10**30}, ":1: 'episode_index': 1000000000000000000000000000000 does not fit in 64 bits"),
    ({"tasks": "push"}, ":1: 'tasks': expected a list of strings, got 'push'"),
])
def test_wrongly_typed_v21_episode_rows_are_named(v21, change, message):
    rows = jsonl_rows(v21 / V21_EPISODES)
    write_jsonl(v21 / V21_EPISODES, [{**rows[0], **change}, *rows[1:]])
    fails(v21, str(v21 / V21_EPISODES), message)


@pytest.mark.parametrize("name, values, message", [
    ("length", [24.0, 30.0, 20.0], "column 'length' holds numbers, expected integers"),
    ("length", pa.array([24, None, 20], pa.int64()), "row 1: column 'length' is null"),
    ("tasks", ["a", "b", "c"], "column 'tasks' holds strings, expected lists of strings"),
    ("videos/observation.images.cam/from_timestamp", [0.0, math.nan, 5.4],
     "row 1: 'videos/observation.images.cam/from_timestamp' is nan, expected a finite time in seconds >= 0"),
])
def test_wrongly_typed_v30_episode_columns_are_named(v30, name, values, message):
    set_column(v30 / V3_EPISODES, name, values)
    fails(v30, str(v30 / V3_EPISODES), message)


def test_a_task_index_out_of_range_is_named_when_the_frames_are_read(v30):
    """It raised IndexError in a loader worker (or, negative, silently gave another task)."""
    task = column(v30 / V3_DATA, "task_index")
    task[60] = 5
    set_column(v30 / V3_DATA, "task_index", pa.array(task, pa.int64()))
    with pytest.raises(RobotDataError, match=r"file-000.parquet: episode 2 frame 6: task_index 5 is out of range "
                                             r"\(2 tasks in the task metadata\)"):
        RobotDataset(v30)
    RobotDataset(v30, episodes=[0, 1])  # the episodes that do not use it still read


@pytest.mark.parametrize("change, message", [
    ({"action": {"mean": [0.0, 0.0]}}, "action.mean has shape [2], expected the feature's shape [3]"),
    ({"observation.images.cam": {"mean": [0.5, 0.5, 0.5]}}, "mean has shape [3], expected shape [3, 1, 1]"),
    ({"action": {"count": [1, 2]}}, "action.count has shape [2], expected one number"),
    ({"action": {"std": ["a", "b", "c"]}}, "action.std: expected a number or a (nested) list of numbers"),
    ({"action": {"std": [1, [2], 3]}}, "action.std: expected a number or a (nested) list of numbers"),
    ({"action": {"std": [1.0, math.nan, 1.0]}}, "action.std: holds NaN or infinity"),
    ({"action": [1, 2, 3]}, "'action': expected a mapping of statistic -> values, got [1, 2, 3]"),
])
def test_statistics_that_do_not_match_the_features_are_named(v30, change, message):
    stats = json.loads((v30 / "meta/stats.json").read_text())
    for key, value in change.items():
        stats[key] = {**stats[key], **value} if isinstance(value, dict) else value
    (v30 / "meta/stats.json").write_text(json.dumps(stats))
    fails(v30, str(v30 / "meta/stats.json"), message)


def test_v21_episode_statistics_that_do_not_match_are_named(v21):
    rows = jsonl_rows(v21 / V21_EPISODES_STATS)
    rows[1]["stats"]["action"]["mean"] = [0.0, 0.0]
    write_jsonl(v21 / V21_EPISODES_STATS, rows)
    fails(v21, f"{v21 / V21_EPISODES_STATS}:2: action.mean has shape [2], expected the feature's shape [3]")
    del rows[1]["stats"]["action"]["mean"]
    write_jsonl(v21 / V21_EPISODES_STATS, rows)
    fails(v21, f"{v21 / V21_EPISODES_STATS}:2: action lacks 'mean'")

