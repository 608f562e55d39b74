import csv
import io
from fractions import Fraction

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from longboat.config.base import ConfigError
from longboat.data.video_sources import VideoSourceConfig, cover_size, open_clips, open_video_split, to_float

H, W, N, RATE = 32, 48, 20, 10  # the clips: 20 frames of 32 × 48 at 10 fps


def value(k: int) -> int:
    """The grey level of frame k."""
    return 10 + 12 * k


def mp4(target, frames: int = N, rate: int = RATE, height: int = H, width: int = W, edges: bool = False) -> bytes:
    """An H.264 clip whose frame k is grey ``value(k)`` (with ``edges``: its 8 leftmost columns black and 8
    rightmost white); written to ``target`` (a path) or returned as bytes (``target`` None)."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=rate, options={"crf": "0"})
        stream.height, stream.width, stream.pix_fmt = height, width, "yuv444p"
        for k in range(frames):
            array = np.full((height, width, 3), value(k), dtype=np.uint8)
            if edges:
                array[:, :8], array[:, -8:] = 0, 255
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            frame.pts = k
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    if target is not None:
        target.write_bytes(out.getvalue())
    return out.getvalue()


def picked(video: np.ndarray) -> list[int]:
    """The frame index each output frame shows, read back from its grey level."""
    return [round((float(frame.mean()) - 10) / 12) for frame in video]


def metadata_csv(root, rows: list[tuple[str, str]]):
    path = root / "metadata.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["video", "prompt"])
        writer.writerows(rows)
    return path


def test_metadata_csv_clips_at_the_clips_own_rate(tmp_path):
    (tmp_path / "clips").mkdir()
    mp4(tmp_path / "clips" / "a.mp4")
    path = metadata_csv(tmp_path, [("clips/a.mp4", "a grey fade")])
    clips = open_clips(VideoSourceConfig(source=str(path), frames=17, fps=10, height=H, width=W, dtype="uint8"))
    assert len(clips) == 1 and clips.captions == ["a grey fade"] and clips.malformed == []
    item = clips[0]
    assert item["caption"] == "a grey fade" and item["video"].dtype == torch.uint8
    assert item["video"].shape == (17, H, W, 3)
    assert picked(item["video"].numpy()) == list(range(17))
    assert np.abs(item["video"].numpy().astype(int) - np.array([value(k) for k in range(17)])[:, None, None, None]
                  ).max() <= 2


@pytest.mark.parametrize("fps, expected", [
    # t = i/4 s: 0.25 lies exactly between frames 2 and 3 and 0.75 between 7 and 8: the earlier frame, exactly.
    (4, [0, 2, 5, 7, 10]),
    # twice the clip's rate: each frame twice (t = 0.05 ties between frames 0 and 1).
    (20, [0, 0, 1, 1, 2, 2, 3, 3, 4]),
    # 30000/1001 s⁻¹ (NTSC): t = i·1001/30000, the nearest tenth of a second.
    ("30000/1001", [0, 0, 1, 1, 1]),
    (2.5, [0, 4, 8, 12, 16]),
])
def test_frames_are_the_nearest_at_another_rate(tmp_path, fps, expected):
    mp4(tmp_path / "a.mp4")
    (tmp_path / "rows.jsonl").write_text('{"video": "a.mp4", "caption": "x"}\n')
    clips = open_clips(VideoSourceConfig(source=str(tmp_path / "rows.jsonl"), frames=len(expected), fps=fps,
                                         height=H, width=W, dtype="uint8"))
    assert picked(clips.frames(0)) == expected
    reference = [min(range(N), key=lambda k: (abs(Fraction(k, RATE) - t), k))
                 for t in (Fraction(i) / Fraction(str(fps)) for i in range(len(expected)))]
    assert reference == expected


def test_parquet_bytes_as_float_channels_first(tmp_path):
    data = [mp4(None), mp4(None, frames=12)]
    pq.write_table(pa.table({"video": data, "caption": ["first", "second"]}), tmp_path / "rows.parquet")
    clips = open_clips(VideoSourceConfig(source=str(tmp_path / "rows.parquet"), frames=5, fps=5, height=H, width=W))
    assert clips.captions == ["first", "second"]
    video = clips[1]["video"]
    assert video.dtype == torch.float32 and video.shape == (3, 5, H, W) and video.is_contiguous()
    assert torch.allclose(video, to_float(clips.frames(1)))
    expected = torch.tensor([value(k) for k in (0, 2, 4, 6, 8)], dtype=torch.float32) / 127.5 - 1
    assert torch.allclose(video.mean(dim=(0, 2, 3)), expected, atol=2 / 127.5)
    assert video.min() >= -1 and video.max() <= 1


def test_aspect_kept_then_centre_cropped(tmp_path):
    mp4(tmp_path / "a.mp4", edges=True)
    (tmp_path / "rows.jsonl").write_text('{"video": "a.mp4", "caption": ""}\n')

    def read(height, width):
        cfg = VideoSourceConfig(source=str(tmp_path / "rows.jsonl"), frames=1, height=height, width=width,
                                dtype="uint8")
        return open_clips(cfg).frames(0)[0].astype(int)

    # 48 wide at full height: the middle 16 columns, unscaled — neither the black nor the white edge.
    middle = read(H, 16)
    assert middle.shape == (H, 16, 3) and np.abs(middle - value(0)).max() <= 2
    # 16 × 16: scaled by 1/2 to 24 × 16 (aspect kept), 4 columns cut each side, the edges' 4 columns with them.
    small = read(16, 16)
    assert small.shape == (16, 16, 3) and np.abs(small[:, 2:-2] - value(0)).max() <= 3
    # wider than the clip: scaled by 4/3 to 64 × 43, 5 rows cut above, 6 below; the edges stay.
    wide = read(32, 64)
    assert wide.shape == (32, 64, 3) and wide[:, :8].max() <= 3 and wide[:, -8:].min() >= 252
    assert cover_size(48, 32, 64, 32) == (64, 43) and cover_size(48, 32, 16, 16) == (24, 16)


@pytest.mark.parametrize("frames", [20, 2, 80])
def test_frames_not_one_plus_four_k_are_refused(tmp_path, frames):
    path = metadata_csv(tmp_path, [])
    with pytest.raises(ConfigError) as e:
        open_clips(VideoSourceConfig(source=str(path), frames=frames))
    assert "\n" not in str(e.value) and f"data.frames: {frames} is not 1 + 4k" in str(e.value)


def test_unreadable_and_short_clips_are_counted_and_named(tmp_path):
    mp4(tmp_path / "good.mp4")
    mp4(tmp_path / "short.mp4", frames=8)
    (tmp_path / "noise.mp4").write_bytes(b"not a video at all" * 10)
    path = metadata_csv(tmp_path, [("good.mp4", "g"), ("short.mp4", "s"), ("noise.mp4", "n"), ("gone.mp4", "m")])
    cfg = VideoSourceConfig(source=str(path), frames=13, fps=10, height=H, width=W)
    with pytest.raises(ConfigError) as e:
        open_clips(cfg)
    message = str(e.value)
    assert "\n" not in message and "3 of 4 clips" in message and "max_malformed_fraction=0.0 allows 0" in message
    for name in ("short.mp4 (line 3): too short", "noise.mp4 (line 4)", "gone.mp4 (line 5)"):
        assert name in message
    cfg.max_malformed_fraction = 0.75
    clips = open_clips(cfg)
    assert clips.captions == ["g"] and len(clips.malformed) == 3
    assert picked(clips.frames(0)) == list(range(13))


def test_bad_source_and_rows_end_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        open_clips(VideoSourceConfig(source=str(tmp_path / "missing.csv"), frames=5))
    (tmp_path / "rows.jsonl").write_text('{"clip": "a.mp4"}\n')
    with pytest.raises(ConfigError, match=r"rows.jsonl line 1 has no 'video' \(data.video_key\)"):
        open_clips(VideoSourceConfig(source=str(tmp_path / "rows.jsonl"), frames=5))
    with pytest.raises(ConfigError, match="data.fps"):
        open_clips(VideoSourceConfig(source=str(tmp_path / "rows.jsonl"), frames=5, fps="fast"))


def test_held_out_split_is_shared_with_images(tmp_path):
    clip = mp4(None, frames=5)
    pq.write_table(pa.table({"video": [clip] * 10, "caption": [str(i) for i in range(10)]}), tmp_path / "r.parquet")
    train, valid = open_video_split(VideoSourceConfig(source=str(tmp_path / "r.parquet"), frames=5, fps=10,
                                                      valid_fraction=0.2, height=8, width=8))
    assert len(train) == 8 and len(valid) == 2 and not set(train.captions) & set(valid.captions)
    assert open_video_split(VideoSourceConfig(source=str(tmp_path / "r.parquet"), frames=5, fps=10))[1] is None
