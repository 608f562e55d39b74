"""Conversations with images: both row forms read with their images, placeholders expanded to the image's token
count with no label on image tokens, malformed rows counted with their row numbers, truncation that never cuts an
image, and rows (packed or not) that carry their images' pixels at the right slots."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from longboat.data.chat.builtin import resolve_chat_template
from longboat.data.chat.images import ImageChatRows, ImageRef, expand_images, image_rows, read_image_conversations
from longboat.data.chat.sources import check_malformed, ChatDataError
from longboat.data.chat.supervision import ChatSupervisor, Sample
from longboat.data.images.processors import QwenImages, SquareImages
from longboat.data.images.qwen_vl import QwenVLImageConfig
from longboat.data.labels import IGNORE_INDEX
from longboat.data.tokenizer import Tokenizer

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "vlm"
IMAGE = 3  # "<image>" in the fixture's tokenizer
SQUARE = SquareImages(32, 4, 2, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))  # 16 tokens an image


def encoded(path: Path = FIXTURE / "shapes.jsonl", processor=SQUARE):
    conversations, report = read_image_conversations(path, processor)
    tokenizer = Tokenizer(FIXTURE / "tokenizer")
    template, _ = resolve_chat_template(tokenizer, None)
    samples, _ = ChatSupervisor(tokenizer, template).encode(conversations)
    return conversations, report, [[expand_images(s, c.images, IMAGE) for s in ss]
                                   for c, ss in zip(conversations, samples)]


def test_both_row_forms_expand_to_the_image_token_count():
    conversations, report, samples = encoded()
    assert report.rows == 96 and report.n_malformed == 0
    assert all(len(c.images) == 1 and c.images[0].tokens == 16 for c in conversations)
    assert "<image>\nWhat" in conversations[0].messages[0]["content"]  # an image part became the placeholder
    assert "<image>\nWhat" in conversations[1].messages[0]["content"]  # a ShareGPT row keeps its own
    for (sample,) in samples:
        image = sample.images[0]
        run = sample.tokens[image.offset:image.offset + 16]
        assert (run == IMAGE).all() and (sample.tokens == IMAGE).sum() == 16
        assert (sample.labels[sample.tokens == IMAGE] == IGNORE_INDEX).all()
        assert not (sample.labels == IMAGE).any() and (sample.labels >= 0).any()  # the answer is supervised


def test_expansion_keeps_the_label_after_the_image():
    tokens = np.array([10, IMAGE, 11, IMAGE, IMAGE, 12], dtype=np.int32)
    labels = np.array([IMAGE, 11, IMAGE, IMAGE, 12, 13], dtype=np.int32)
    refs = [ImageRef("a", 2), ImageRef("b", 3), ImageRef("c", 1)]
    out = expand_images(Sample(tokens, labels), refs, IMAGE)
    assert out.tokens.tolist() == [10, IMAGE, IMAGE, 11, IMAGE, IMAGE, IMAGE, IMAGE, 12]
    assert out.labels.tolist() == [-100, -100, 11, -100, -100, -100, -100, 12, 13]
    assert [(r.path, r.offset) for r in out.images] == [("a", 1), ("b", 4), ("c", 7)]


def test_qwen_geometry_counts_merged_patches():
    qwen = QwenImages(QwenVLImageConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=4096))
    assert qwen.tokens(32, 48) == (32 // 4) * (48 // 4) // 4
    batch = qwen([np.zeros((32, 48, 3), dtype=np.uint8)])
    assert batch["image_grid"].tolist() == [[1, 8, 12]] and batch["images"].shape == (96, 3 * 2 * 16)


def test_malformed_rows_are_counted_with_their_row_numbers(tmp_path):
    shutil.copytree(FIXTURE / "images", tmp_path / "images")
    (tmp_path / "images" / "broken.png").write_bytes(b"not a png")
    good = json.loads((FIXTURE / "shapes.jsonl").read_text().splitlines()[1])
    two = {**good, "conversations": [{"from": "human", "value": "<image><image> Which?"},
                                     {"from": "gpt", "value": "red"}]}
    rows = [good, two, {**good, "images": ["images/nowhere.png"]}, {**good, "images": ["images/broken.png"]},
            {"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]},
                          {"role": "assistant", "content": "no"}]}, good,
            {"messages": [{"role": "user", "content": [
                {"type": "text", "text": "Look: "},
                {"type": "image_url", "image_url": {"url": f"file://{tmp_path}/images/000_yellow_square.png"}}]},
                {"role": "assistant", "content": "yellow"}], "images": []},
            {"instruction": "<image> Which colour?", "output": "red", "images": good["images"]}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    conversations, report = read_image_conversations(path, SQUARE)
    assert [c.row for c in conversations] == [1, 6, 7, 8]
    assert conversations[2].images[0].path == str(tmp_path / "images" / "000_yellow_square.png")
    assert conversations[2].messages[0]["content"] == "Look: <image>"
    assert conversations[0].images[0].path == str(tmp_path / good["images"][0])  # relative to the data file
    assert report.examples == {"image count mismatch": [2], "missing image": [3], "unreadable image": [4],
                               "unknown content part": [5]}
    with pytest.raises(ChatDataError, match=r"4 of 8 rows are malformed.*image count mismatch × 1 \(rows 2\)"):
        check_malformed(report, 0.4)


def test_truncation_never_cuts_through_an_image():
    sample = Sample(np.arange(10, dtype=np.int32), np.arange(10, dtype=np.int32), [ImageRef("a", 3, 2),
                                                                                   ImageRef("b", 2, 6)])
    assert sample.truncated(3) is None and sample.truncated(7) is None
    assert [r.path for r in sample.truncated(5).images] == ["a"]
    assert [r.path for r in sample.truncated(2).images] == []
    assert len(sample.truncated(8).images) == 2


@pytest.mark.parametrize("packing", [True, False])
def test_rows_carry_their_images_at_their_slots(packing):
    _, _, samples = encoded()
    flat = [s for ss in samples for s in ss][:12]
    rows = image_rows(flat, 128, 0, SQUARE, packing)
    assert isinstance(rows, ImageChatRows)
    items = [rows[r] for r in range(len(rows))]
    assert sum(len(item["images"]) for item in items) == 12
    for item in items:
        slots = item["image_slots"]
        assert len(slots) == len(item["images"]) == (item["tokens"] == IMAGE).sum() // 16
        for row, start in slots.tolist():
            assert row == 0 and (item["tokens"][start:start + 16] == IMAGE).all()
            segment = item["segments"][start]
            assert (item["segments"][start:start + 16] == segment).all()  # an image stays inside its sample
            first = int((item["segments"] == segment).nonzero()[0])
            assert item["position_ids"][first] == 0  # positions restart per sample
    batch = ImageChatRows.collate(items[:2])
    assert batch["tokens"].shape == (2, 128) and len(batch["images"]) == len(batch["image_slots"])
    for row, start in batch["image_slots"].tolist():
        assert (batch["tokens"][row, start:start + 16] == IMAGE).all()
    k = len(items[0]["images"])
    assert torch.equal(batch["images"][:k], items[0]["images"])  # in the order of their slots


def test_pixels_are_decoded_when_a_row_is_read(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "vlm", ignore=shutil.ignore_patterns("generate.py"))
    _, _, samples = encoded(tmp_path / "vlm" / "shapes.jsonl")
    rows = image_rows([s for ss in samples for s in ss][:2], 128, 0, SQUARE, False)
    image = Image.open(rows.images[0][0][0])
    expected = (np.asarray(image.convert("RGB").resize((32, 32), Image.Resampling.BICUBIC), np.float32) / 255
                - 0.5) / 0.25
    assert torch.allclose(rows[0]["images"][0], torch.from_numpy(expected.transpose(2, 0, 1)))
    Path(rows.images[1][0][0]).write_bytes(b"gone bad")  # read after the rows were made: fails when read
    with pytest.raises(Exception, match="cannot read"):
        rows[1]
