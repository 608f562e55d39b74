"""Prompts with images: ``generate --image`` on a tiny random vision-language model equals a full forward argmax loop
without a cache, over the same preprocessing and placeholder expansion as the SFT data; refusals are one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from longboat.cli.main import main
from longboat.data.chat.images import expand_images, image_ref
from longboat.data.chat.supervision import Sample
from longboat.recipes.generate import load_for_inference
from tests.recipes.conftest import VLM_FIXTURE

IMAGES = VLM_FIXTURE / "images"
RED, BLUE = IMAGES / "006_red_square.png", IMAGES / "004_blue_triangle.png"


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@torch.inference_mode()
def reference(loaded, text: str, images: list[Path], max_new_tokens: int) -> list[int]:
    """Greedy tokens from full forwards without a cache, the prompt expanded as the SFT data expands it."""
    reader = loaded.images.reader
    tokens = np.asarray(loaded.tokenizer.encode(text))
    sample = expand_images(Sample(tokens, tokens.copy()), [image_ref(p, reader.processor) for p in images],
                           reader.image_token_id)
    pixels = reader.processor([str(p) for p in images]) if images else {}
    slots = torch.tensor([[0, r.offset] for r in sample.images]) if images else None
    ids, new = [int(t) for t in sample.tokens], []
    for _ in range(max_new_tokens):
        logits = loaded.model(torch.tensor([ids + new]), image_slots=slots, **pixels)
        token = int(logits[0, -1].argmax())
        if token in loaded.stop_ids:
            break
        new.append(token)
    return new


@pytest.fixture(scope="module")
def vlm(vlm_export):
    return load_for_inference(vlm_export)


@pytest.mark.parametrize("prompt, images", [
    ("<image>\nWhat colour is the shape?", [RED]),
    ("What colour is the shape?", [BLUE]),  # no placeholder: the image comes first
    ("<image> or <image>?", [RED, BLUE]),
])
def test_generate_with_images_equals_a_full_forward_loop(vlm, vlm_export, capsys, prompt, images):
    text = prompt if "<image>" in prompt else "<image>" * len(images) + prompt
    expected = vlm.tokenizer.decode(reference(vlm, text, images, 12))
    flags = [f for p in images for f in ("--image", str(p))]
    code, out, _ = run_cli(capsys, "generate", str(vlm_export), "--prompt", prompt, *flags, "--temperature", "0",
                           "--max-new-tokens", "12")
    assert code == 0 and out == prompt + expected + "\n" and expected


def test_qwen_tower_with_images_of_two_shapes(qwen_vlm_export, capsys, tmp_path):
    """Images of their own aspect ratio: patch rows of varying count per image, with their grids."""
    from PIL import Image

    wide = tmp_path / "wide.png"
    Image.open(BLUE).resize((48, 24)).save(wide)
    loaded = load_for_inference(qwen_vlm_export)
    assert [loaded.images.reader.processor.tokens(*s) for s in ((32, 32), (24, 48))] == [16, 18]
    prompt = "<image> or <image>?"
    expected = loaded.tokenizer.decode(reference(loaded, prompt, [RED, wide], 10))
    code, out, _ = run_cli(capsys, "generate", str(qwen_vlm_export), "--prompt", prompt, "--image", str(RED),
                           "--image", str(wide), "--temperature", "0", "--max-new-tokens", "10")
    assert code == 0 and out == prompt + expected + "\n" and expected


def test_the_image_changes_the_output(vlm):
    """Otherwise the tests above could pass with the pixels dropped."""
    text = "<image>\nWhat colour is the shape?"
    assert reference(vlm, text, [RED], 8) != reference(vlm, text, [BLUE], 8)


def test_chat_prompt_with_an_image(vlm, vlm_export, capsys):
    messages = [{"role": "user", "content": "<image>What shape is this?"}]
    ids = vlm.render_chat(messages)
    expected = vlm.tokenizer.decode(reference(vlm, vlm.tokenizer.decode(ids), [RED], 10))
    code, out, _ = run_cli(capsys, "generate", str(vlm_export), "--chat", "--prompt", "What shape is this?",
                           "--image", str(RED), "--temperature", "0", "--max-new-tokens", "10")
    assert code == 0 and out == expected + "\n"


def test_messages_with_image_parts(vlm_export, capsys, tmp_path):
    """Image parts of a --messages file, relative to it, reply as --chat --prompt with --image."""
    import json
    import shutil

    shutil.copy(RED, tmp_path / "red.png")
    messages = [{"role": "user", "content": [{"type": "image", "image": "red.png"},
                                             {"type": "text", "text": "What shape is this?"}]}]
    (tmp_path / "messages.json").write_text(json.dumps(messages))
    sampling = ["--temperature", "0", "--max-new-tokens", "10"]
    code, out, _ = run_cli(capsys, "generate", str(vlm_export), "--messages", str(tmp_path / "messages.json"),
                           *sampling)
    assert code == 0
    assert out == run_cli(capsys, "generate", str(vlm_export), "--chat", "--prompt", "What shape is this?",
                          "--image", str(RED), *sampling)[1]
    messages[0]["content"][0]["image"] = "none.png"
    code, _, err = run_cli(capsys, "generate", str(vlm_export), "--messages", json.dumps(messages), *sampling)
    assert code == 2 and err.strip() == "error: --messages: missing image (none.png)"


@pytest.fixture(scope="module")
def text_export(tmp_path_factory) -> Path:
    from longboat.checkpoint.export import save_export
    from longboat.config.base import validate
    from longboat.models import get_model
    from longboat.tasks.pretrain import tokenizer_assets

    spec = get_model("decoder")
    cfg = validate(spec.config, {"vocab_size": 512, "d_model": 16, "n_layers": 1, "n_heads": 2,
                                 "n_kv_heads": 1, "ffn_dim": 32, "max_seq_len": 64}, "test")
    out = tmp_path_factory.mktemp("text") / "export"
    return save_export(out, spec.build(cfg), "decoder", cfg.model_dump(mode="json"),
                       tokenizer_assets(VLM_FIXTURE / "tokenizer"))


def test_refusals_are_one_line(vlm_export, text_export, capsys, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    cases = [
        (text_export, ["--image", str(RED)], f"{text_export}: the model reads no images (DecoderConfig is a "
                                             f"text-only model); drop the images"),
        (vlm_export, ["--image", str(tmp_path / "none.png")], f"--image {tmp_path / 'none.png'}: missing image"),
        (vlm_export, ["--image", str(broken)], f"--image {broken}: unreadable image"),
        (vlm_export, ["--image", str(RED), "--prompt", "<image><image>"], "--prompt: 2 placeholders '<image>' for 1 "
                                                                          "images"),
        (vlm_export, ["--prompt", "<image>"], "prompt: 1 image tokens '<image>' for 0 images"),
    ]
    for model, flags, message in cases:
        code, out, err = run_cli(capsys, "generate", str(model), *flags, "--max-new-tokens", "2")
        assert code == 2 and out == "", (flags, err)
        assert err.startswith(f"error: {message}") and len(err.strip().splitlines()) == 1, err
