"""``longboat data info``: what a user reads about a dataset, and a one-line error for a wrong path."""

import shutil
from pathlib import Path

from longboat.cli.main import main
from tests.data.robot.lerobot_edit import V3_DATA, V3_EPISODES, copy_fixture, edit_info, set_column

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def test_info_v30(capsys):
    assert not main(["data", "info", str(FIXTURES / "lerobot_v30" / "dataset")])
    out = capsys.readouterr().out
    for line in ("format    LeRobot v3.0", "robot     toy_arm", "fps       10", "episodes  3", "frames    74",
                 "tasks     2", "0  push the block to the left", "1  lift the cup"):
        assert line in out, out
    lines = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.startswith("  ") and "[" in ln}
    assert lines["observation.images.cam"] == ["video", "[48,", "64,", "3]", "av1", "yuv420p"]
    assert lines["observation.state"] == ["float32", "[4]"] and lines["index"] == ["int64", "[1]"]


def test_info_v21_and_ours(capsys, written_h264):
    assert not main(["data", "info", str(FIXTURES / "lerobot_v21" / "dataset")])
    assert "format    LeRobot v2.1" in capsys.readouterr().out
    root, _ = written_h264
    assert not main(["data", "info", str(root)])
    out = capsys.readouterr().out
    assert "h264 yuv420p" in out and "observation.images.wrist  image    [16, 24, 3]" in out
    assert "next.done                 bool     [1]" in out and "frames    15" in out


def test_info_bad_path(tmp_path, capsys):
    assert main(["data", "info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a LeRobot dataset (meta/info.json not found)" in err and "Traceback" not in err


def test_info_reports_a_truncated_data_file(tmp_path, capsys, written_h264):
    """info reads every data file's parquet footer: a file cut short is named in one line, exit status 2."""
    root, _ = written_h264
    copy = tmp_path / "ds"
    shutil.copytree(root, copy)
    data = sorted((copy / "data").rglob("*.parquet"))[-1]
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    assert main(["data", "info", str(copy)]) == 2
    captured = capsys.readouterr()
    assert f"{data}: not a readable parquet file" in captured.err and "Traceback" not in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and "features" not in captured.out


def test_info_refuses_frames_the_data_files_do_not_hold(tmp_path, capsys):
    """Episode lengths (and total_frames) that add up to more rows than the data file holds: info printed them."""
    root = copy_fixture("v30", tmp_path / "ds")
    set_column(root / V3_EPISODES, "length", [24, 30, 26])
    set_column(root / V3_EPISODES, "dataset_to_index", [24, 54, 80])
    edit_info(root, total_frames=80)
    assert main(["data", "info", str(root)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert f"{root / V3_DATA}: holds 74 rows but the episode metadata puts 80 in it" in captured.err
