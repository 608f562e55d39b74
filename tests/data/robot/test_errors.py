"""Bad input fails in one line that names the path or key: each case a user can run into."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longboat.data.robot import RobotDataError, RobotDataset, UnknownFeatureError, VideoDecodeError
from longboat.data.robot.video import VideoFrameReader

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "lerobot_v30" / "dataset"
VIDEO = "videos/observation.images.cam/chunk-000/file-000.mp4"
DATA = "data/chunk-000/file-000.parquet"


@pytest.fixture
def copy(tmp_path) -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / "ds"))


def fails(exc_type, *fragments, call):
    with pytest.raises(exc_type) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for f in fragments:
        assert f in message, f"{f!r} not in {message!r}"
    return message


def test_not_a_dataset(tmp_path):
    fails(RobotDataError, str(tmp_path / "nope"), "not a LeRobot dataset", call=lambda: RobotDataset(tmp_path / "nope"))
    fails(RobotDataError, "meta/info.json not found", call=lambda: RobotDataset(tmp_path))


def test_unsupported_version(copy):
    info = json.loads((copy / "meta/info.json").read_text())
    (copy / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.0"}))
    fails(RobotDataError, "info.json", "'v2.0' is not supported", "v3.0, v2.1", call=lambda: RobotDataset(copy))


def test_missing_video_file(copy):
    (copy / VIDEO).unlink()
    fails(VideoDecodeError, str(copy / VIDEO), "not found", call=lambda: RobotDataset(copy))


def test_truncated_video_file(copy):
    data = (copy / VIDEO).read_bytes()
    (copy / VIDEO).write_bytes(data[: len(data) // 3])
    ds = RobotDataset(copy)
    fails(VideoDecodeError, str(copy / VIDEO), call=lambda: [ds[i] for i in range(len(ds))])


def test_truncated_video_header(copy):
    (copy / VIDEO).write_bytes((copy / VIDEO).read_bytes()[:100])
    fails(VideoDecodeError, str(copy / VIDEO), "cannot open video", call=lambda: RobotDataset(copy)[0])


def test_timestamp_without_a_frame():
    reader = VideoFrameReader(tolerance_s=1e-4)
    fails(VideoDecodeError, str(FIXTURE / VIDEO), "no frame within 0.0001s of timestamp(s) 0.1500",
          call=lambda: reader.decode(FIXTURE / VIDEO, [0.1, 0.15]))
    assert reader.decode(FIXTURE / VIDEO, [0.1, 0.2]).shape == (2, 48, 64, 3)


def _rewrite_data(copy: Path, change) -> None:
    table = pq.read_table(copy / DATA)
    pq.write_table(change(table), copy / DATA)


def test_parquet_column_missing(copy):
    _rewrite_data(copy, lambda t: t.drop_columns(["action"]))
    fails(RobotDataError, str(copy / DATA), "column 'action' of info.json features is missing",
          call=lambda: RobotDataset(copy))


def test_parquet_column_shape_disagrees(copy):
    def widen(t):
        wide = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(t.num_rows * 5, np.float32)), 5)
        return t.set_column(t.schema.get_field_index("action"), "action", wide)
    _rewrite_data(copy, widen)
    fails(RobotDataError, str(copy / DATA), "column 'action' has shape [5], info.json says [3]",
          call=lambda: RobotDataset(copy))


def test_parquet_extra_column(copy):
    _rewrite_data(copy, lambda t: t.append_column("observation.extra", pa.array(np.zeros(t.num_rows))))
    fails(RobotDataError, "['observation.extra'] are not in info.json features", call=lambda: RobotDataset(copy))


def test_unknown_feature_requested():
    fails(UnknownFeatureError, "feature 'observation.wrist' does not exist", "observation.state",
          call=lambda: RobotDataset(FIXTURE, delta_timestamps={"observation.wrist": [0.0]}))


def test_bad_info_fields(copy):
    info = json.loads((copy / "meta/info.json").read_text())
    info["features"]["action"]["shape"] = [0]
    (copy / "meta/info.json").write_text(json.dumps(info))
    fails(RobotDataError, "features.action.shape", call=lambda: RobotDataset(copy))
    (copy / "meta/info.json").write_text("{not json")
    fails(RobotDataError, "info.json: not valid JSON", call=lambda: RobotDataset(copy))


def test_offsets_that_are_not_finite_frame_counts():
    """An infinite offset became a garbage row offset, and every window of the key was padded."""
    fails(RobotDataError, "delta_timestamps.action: offsets [0.0, inf] at fps 10 are not finite frame counts",
          call=lambda: RobotDataset(FIXTURE, delta_timestamps={"action": [0.0, float("inf")]}))
