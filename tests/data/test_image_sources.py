import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from longboat.config.base import ConfigError
from longboat.data.image_sources import ImageSourceConfig, load_digits, open_images, open_split


def _png(path, value: int, size: int = 6, mode: str = "L"):
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.full((size, size) if mode == "L" else (size, size, 3), value, dtype=np.uint8)
    Image.fromarray(array, mode).save(path)
    return path


def _png_bytes(value: int, size: int = 6) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((size, size), value, dtype=np.uint8), "L").save(out, format="PNG")
    return out.getvalue()


def test_digits_are_sklearns_scaled_to_minus_one_one():
    from sklearn.datasets import load_digits as sklearn_digits

    ref = sklearn_digits()
    images = load_digits()
    assert images.images.shape == (1797, 1, 8, 8) and len(images) == 1797
    assert images.images.min() == -1 and images.images.max() == 1
    assert torch.equal(images.images[5, 0], torch.from_numpy(ref.images[5]).float() / 8 - 1)
    assert torch.equal(images.labels, torch.from_numpy(ref.target).long())
    assert images.classes == [str(i) for i in range(10)]


def test_digits_split_is_fixed_and_disjoint():
    cfg = ImageSourceConfig(source="digits", valid_fraction=0.2)
    train, valid = open_split(cfg)
    train2, valid2 = open_split(cfg)
    assert len(valid) == 359 and len(train) + len(valid) == 1797
    assert torch.equal(valid.images, valid2.images) and torch.equal(train.labels, train2.labels)


def test_folder_classes_are_sorted_subfolders(tmp_path):
    _png(tmp_path / "zebra" / "a.png", 255)
    _png(tmp_path / "apple" / "b.png", 0)
    _png(tmp_path / "apple" / "c.png", 0, size=10, mode="RGB")  # resized and made grey
    images = open_images(ImageSourceConfig(source=str(tmp_path), image_size=4))
    assert images.classes == ["apple", "zebra"]
    assert images.labels.tolist() == [0, 0, 1]
    assert images.images.shape == (3, 1, 4, 4)
    assert torch.all(images.images[:2] == -1) and torch.all(images.images[2] == 1)


def test_folder_rgb_has_three_channels(tmp_path):
    _png(tmp_path / "a" / "x.png", 255)
    images = open_images(ImageSourceConfig(source=str(tmp_path), image_size=6, channels=3))
    assert images.images.shape == (1, 3, 6, 6)


def test_unreadable_files_are_counted_and_named(tmp_path):
    for i in range(3):
        _png(tmp_path / "a" / f"{i}.png", 10)
    (tmp_path / "a" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ConfigError, match=r"1 of 4 images .*broken\.png.*max_malformed_fraction=0\.0"):
        open_images(ImageSourceConfig(source=str(tmp_path)))
    images = open_images(ImageSourceConfig(source=str(tmp_path), max_malformed_fraction=0.25))
    assert len(images) == 3 and images.malformed == [str(tmp_path / "a" / "broken.png")]


def test_jsonl_paths_relative_to_the_file_and_string_labels(tmp_path):
    _png(tmp_path / "img" / "1.png", 255)
    _png(tmp_path / "img" / "2.png", 0)
    rows = [{"image": "img/1.png", "label": "cat", "caption": "a white square"},
            {"image": "img/2.png", "label": "bird", "caption": "a black square"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    images = open_images(ImageSourceConfig(source=str(tmp_path / "rows.jsonl"), image_size=6))
    assert images.classes == ["bird", "cat"] and images.labels.tolist() == [1, 0]
    assert images.captions == ["a white square", "a black square"]
    assert torch.all(images.images[0] == 1)


def test_parquet_bytes_and_int_labels(tmp_path):
    table = pa.table({"image": [_png_bytes(0), _png_bytes(255), b"junk"], "label": [2, 0, 1]})
    pq.write_table(table, tmp_path / "rows.parquet")
    cfg = ImageSourceConfig(source=str(tmp_path / "rows.parquet"), image_size=6, max_malformed_fraction=0.5)
    images = open_images(cfg)
    assert images.labels.tolist() == [2, 0] and images.classes == ["0", "1", "2"]
    assert images.malformed == [f"{tmp_path / 'rows.parquet'} row 3"]
    with pytest.raises(ConfigError, match="row 3"):
        open_images(cfg.model_copy(update={"max_malformed_fraction": 0.0}))


@pytest.mark.parametrize("rows, match", [
    ([{"picture": "a.png"}], r"line 1 has no 'image' \(data.image_key\); keys: picture"),
    ([{"image": "a.png", "label": 1.5}], "must be an int or a str"),
    ([{"image": "a.png", "label": -1}], "negative"),
])
def test_bad_rows_are_one_line(tmp_path, rows, match):
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=match):
        open_images(ImageSourceConfig(source=str(tmp_path / "rows.jsonl")))


def test_bad_sources_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such folder or file"):
        open_images(ImageSourceConfig(source=str(tmp_path / "missing")))
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(ConfigError, match="expected 'digits'"):
        open_images(ImageSourceConfig(source=str(tmp_path / "x.txt")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no class subfolders"):
        open_images(ImageSourceConfig(source=str(tmp_path / "empty")))
