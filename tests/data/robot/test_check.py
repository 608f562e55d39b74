"""``longboat data info --check``: every data file read and every video opened, each problem listed, exit 2 with
one error line when there is any."""

import pyarrow as pa
import pytest

from longboat.cli.main import main
from tests.data.robot.lerobot_edit import (FIXTURES, V3_DATA, V3_VIDEO, V21_EPISODES, column, copy_fixture,
                                           edit_info, jsonl_rows, set_column, write_jsonl)


def check(root, capsys) -> tuple[int, str, str]:
    code = main(["data", "info", str(root), "--check"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.mark.parametrize("version, summary", [("v30", "checked   1 data file (74 rows), 1 video file: no problems"),
                                              ("v21", "checked   3 data files (74 rows), 3 video files: no problems")])
def test_the_fixtures_have_no_problems(capsys, version, summary):
    code, out, err = check(FIXTURES / f"lerobot_{version}" / "dataset", capsys)
    assert not code and err == "" and out.rstrip().endswith(summary), out


def test_each_problem_of_the_rows_is_listed(tmp_path, capsys):
    """Four problems in one file, none of which the footer shows: each is listed, then one error line."""
    root = copy_fixture("v30", tmp_path / "ds")
    ts = column(root / V3_DATA, "timestamp")
    ts[30] = ts[29]  # episode 1, frame 6: time stands still
    set_column(root / V3_DATA, "timestamp", pa.array(ts, pa.float32()))
    frame = column(root / V3_DATA, "frame_index")
    frame[60] = 99  # episode 2, frame 6
    set_column(root / V3_DATA, "frame_index", pa.array(frame, pa.int64()))
    index = column(root / V3_DATA, "index")
    index[3] = 1000  # episode 0, frame 3
    set_column(root / V3_DATA, "index", pa.array(index, pa.int64()))
    task = column(root / V3_DATA, "task_index")
    task[10] = -1  # episode 0, frame 10
    set_column(root / V3_DATA, "task_index", pa.array(task, pa.int64()))
    code, out, err = check(root, capsys)
    data = root / V3_DATA
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert f"{root}: 4 problems in the data files (listed above)" in err
    assert "checked   1 data file (74 rows), 1 video file: 4 problems" in out
    for line in (f"  {data}: episode 0: index is not 0..23 in row order (frame 3 has 1000)",
                 f"  {data}: episode 0 frame 10: task_index -1 is out of range (2 tasks in the task metadata)",
                 f"  {data}: episode 1: timestamp does not increase at frame 6 (0.5 -> 0.5)",
                 f"  {data}: episode 2: frame_index is not 0..19 in row order (frame 6 has 99)"):
        assert line in out.splitlines(), out


def test_problems_of_several_files_are_listed_together(tmp_path, capsys):
    """A length the file does not hold (seen in the footer and in the rows), a missing data file, a truncated video
    and a data file no episode points to: opening stops at the first, --check lists them all."""
    root = copy_fixture("v21", tmp_path / "ds")
    rows = jsonl_rows(root / V21_EPISODES)
    rows[0]["length"] = 25
    write_jsonl(root / V21_EPISODES, rows[:2])  # episode 2 is no longer in the metadata ...
    edit_info(root, total_episodes=2, total_frames=55)
    data0 = root / "data/chunk-000/episode_000000.parquet"
    video1 = root / "videos/chunk-000/observation.images.cam/episode_000001.mp4"
    video1.write_bytes(video1.read_bytes()[:200])
    (root / "data/chunk-000/episode_000001.parquet").unlink()
    assert main(["data", "info", str(root)]) == 2  # without --check: the first problem, alone
    assert capsys.readouterr().err.count("\n") == 1
    code, out, err = check(root, capsys)
    assert code == 2 and err.count("\n") == 1 and "5 problems in the data files" in err, err
    for fragment in (f"{data0}: holds 24 rows but the episode metadata puts 25 in it (episode 0 of length 25)",
                     f"{data0}: episode 0 has 24 rows, the episode metadata says 25",
                     f"{root / 'data/chunk-000/episode_000001.parquet'}: file not found",
                     f"{root / 'data/chunk-000/episode_000002.parquet'}: no episode of the episode metadata points to",
                     f"{video1}: cannot decode video"):
        assert fragment in out, (fragment, out)
    assert "checked   2 data files (24 rows), 2 video files: 5 problems" in out


def test_a_video_too_short_for_its_episodes_is_listed(tmp_path, capsys):
    root = copy_fixture("v30", tmp_path / "ds")
    set_column(root / "meta/episodes/chunk-000/file-000.parquet", "videos/observation.images.cam/from_timestamp",
               [0.0, 2.4, 6.0])
    code, out, err = check(root, capsys)
    assert code == 2, out + err
    assert f"{root / V3_VIDEO}: the video ends at 7.4000s, before the last frame of episode 2 (at 7.9000s)" in out, out


def test_a_missing_video_is_listed(tmp_path, capsys):
    root = copy_fixture("v30", tmp_path / "ds")
    (root / V3_VIDEO).unlink()
    code, out, err = check(root, capsys)
    assert code == 2 and f"{root / V3_VIDEO}: video file of 'observation.images.cam' not found" in out


def test_damaged_pages_behind_a_sound_footer_are_listed(tmp_path, capsys):
    """Opening reads only footers and passes; --check decodes every page, and names the file on one line."""
    root = copy_fixture("v30", tmp_path / "ds")
    data = bytearray((root / V3_DATA).read_bytes())
    data[8:600] = b"\x55" * 592  # the first column chunks; the footer at the end is intact
    (root / V3_DATA).write_bytes(bytes(data))
    assert not main(["data", "info", str(root)])
    capsys.readouterr()
    code, out, err = check(root, capsys)
    assert code == 2 and err.count("\n") == 1, err
    problems = [line for line in out.splitlines() if line.startswith("  /")]
    assert len(problems) == 1 and problems[0].startswith(f"  {root / V3_DATA}: not a readable parquet file ("), out


def test_nan_and_infinity_in_the_data_are_listed(tmp_path, capsys):
    """A NaN action trains a NaN loss; opening does not read the values, --check does."""
    root = copy_fixture("v30", tmp_path / "ds")
    action = column(root / V3_DATA, "action")
    action[5][1], action[40][0] = float("nan"), float("inf")
    set_column(root / V3_DATA, "action", pa.array(action, pa.list_(pa.float32(), 3)))
    code, out, err = check(root, capsys)
    assert code == 2 and f"  {root / V3_DATA}: column 'action' holds 2 NaN or infinite value(s)" in out.splitlines()
    assert "1 problem in the data files" in err
