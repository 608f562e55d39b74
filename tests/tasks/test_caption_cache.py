"""The caption cache: encoded once, read back without encoding while captions and encoder are unchanged, encoded
again into a new folder when either changes; written whole or not at all."""

from __future__ import annotations

import pytest
import torch

from longboat.config.base import ConfigError
from longboat.tasks.caption_cache import NULL_CAPTION, caption_table
from longboat.tasks.text_encoder import TextEncoder, TextEncoderConfig
from tests.tasks.test_text_encoder import encoder_config

CAPTIONS = ["a red circle", "a blue square", "a red circle"]
pytestmark = pytest.mark.usefixtures("one_thread")


def make(**changes) -> TextEncoder:
    return TextEncoder(TextEncoderConfig.model_validate(encoder_config(**changes)))


def folders(root) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_an_unchanged_cache_is_read_not_encoded(tmp_path):
    enc = make()
    table = caption_table(enc, CAPTIONS, tmp_path)
    assert enc.calls == 3  # the two captions and the empty one, each once
    assert table.captions == [NULL_CAPTION, "a blue square", "a red circle"]
    again = make()  # a new process would build its encoder anew
    read = caption_table(again, list(reversed(CAPTIONS)), tmp_path)
    assert again.calls == 0 and len(folders(tmp_path)) == 1
    assert torch.equal(read.embeddings, table.embeddings) and torch.equal(read.mask, table.mask)
    null, null_mask = read.null
    assert torch.equal(null, table.embeddings[0]) and null_mask.sum() == 1  # the empty caption: its BOS alone
    assert read.rows(CAPTIONS).tolist() == [2, 1, 2]


def test_a_changed_caption_or_encoder_is_encoded_again(tmp_path):
    caption_table(make(), CAPTIONS, tmp_path)
    changed = make()
    caption_table(changed, CAPTIONS + ["a green triangle"], tmp_path)
    assert changed.calls == 4 and len(folders(tmp_path)) == 2
    other_weights = make(seed=7)
    table = caption_table(other_weights, CAPTIONS, tmp_path)
    assert other_weights.calls == 3 and len(folders(tmp_path)) == 3
    assert not torch.equal(table.embeddings, caption_table(make(), CAPTIONS, tmp_path).embeddings)
    assert len(folders(tmp_path)) == 3 and not any(name.startswith(".") for name in folders(tmp_path))


def test_a_failed_encoding_leaves_nothing_and_a_damaged_cache_is_one_line(tmp_path):
    class Failing:
        def fingerprint(self) -> str:
            return "f"

        def encode(self, captions):
            raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        caption_table(Failing(), CAPTIONS, tmp_path / "c")
    assert not (tmp_path / "c").exists() or folders(tmp_path / "c") == []
    caption_table(make(), CAPTIONS, tmp_path)
    (shard,) = tmp_path.glob("text-*/shard-00000.safetensors")
    shard.write_bytes(b"cut")
    with pytest.raises(ConfigError, match="unreadable caption cache .* delete the folder"):
        caption_table(make(), CAPTIONS, tmp_path)
