"""ERNIE-4.5-VL-MoE checkpoints in and out: a tiny random transformers ``Ernie4_5_VLMoeForConditionalGeneration``
(tower and resampler, text and vision experts routed by token type, 3-D RoPE) imports with its logits and greedy
generations on two images of odd sizes, ours exports to transformers with ours, the convert round trip is exact, the
images equal its image processor's, and what the model cannot represent is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from longboat.models import get_model, hf_spec
from longboat.models.llm.generation import generate
from longboat.models.llm.hf import HFConversionError, load_hf_model

transformers = pytest.importorskip("transformers")

IMG, START, END = 60, 62, 63
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=14, spatial_merge_size=2)
TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, moe_intermediate_size=[32, 16], moe_k=2, moe_num_experts=4,
            moe_num_shared_experts=1, max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]})
SIZES = [(47, 83), (61, 39)]  # (height, width): odd, one wide and one tall


def hf_model(text: dict | None = None, vision: dict | None = None):
    config = transformers.AutoConfig.for_model(
        "ernie4_5_vl_moe", vision_config={**VISION, **(vision or {})}, text_config={**TEXT, **(text or {})},
        image_token_id=IMG, image_start_token_id=START, image_end_token_id=END, video_token_id=61,
        video_start_token_id=58, video_end_token_id=59)
    torch.manual_seed(0)
    model = transformers.Ernie4_5_VLMoeForConditionalGeneration(config).eval()
    with torch.no_grad():  # away from unit norms and zero biases, so that every tensor matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ernie4_5_vl_moe") / "hf"
    model = hf_model()
    model.save_pretrained(path)
    return model, path


def pictures():
    g = np.random.default_rng(0)
    return [g.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]


def inputs(cfg):
    pixels = cfg.image_processor()(pictures())
    counts = (pixels["image_grid"].prod(dim=1) // 4).tolist()
    row = [1, 2, 3]
    for i, n in enumerate(counts):
        row += [START] + [IMG] * n + [END] + [20 + i, 21 + i]
    return torch.tensor([row]), pixels


def theirs(hf, tokens, pixels, **kwargs):
    vision = (tokens == IMG) | (tokens == START) | (tokens == END)  # as its processor marks them
    return hf(input_ids=tokens, pixel_values=pixels["images"], image_grid_thw=pixels["image_grid"],
              mm_token_type_ids=(tokens == IMG).long(), moe_mm_token_type_ids=vision.long(), **kwargs).logits


def test_import_gives_transformers_logits(checkpoint):
    hf, path = checkpoint
    assert hf_spec(path).name == "vlm"
    model, cfg, family = load_hf_model(path)
    assert family == "ernie4_5_vl_moe" and cfg.vision_token_ids == (START, END)
    assert cfg.language.mrope_section == (2, 3, 3) and cfg.language.mrope_alternating
    assert cfg.language.vision_moe.expert_ffn_dim == 16 and cfg.language.dense_layers == [0]
    tokens, pixels = inputs(cfg)
    with torch.no_grad():
        ours = model(tokens, images=pixels["images"], image_grid=pixels["image_grid"])
        want = theirs(hf, tokens, pixels)
        torch.testing.assert_close(ours, want, atol=1e-4, rtol=0)
        text = tokens[:, :3]  # a batch without images
        torch.testing.assert_close(model(text), hf(input_ids=text).logits, atol=1e-4, rtol=0)


def test_images_equal_the_image_processor(checkpoint):
    _, path = checkpoint
    _, cfg, _ = load_hf_model(path)
    ours = cfg.image_processor()(pictures())
    processor = transformers.Ernie4_5_VLMoeImageProcessor()
    want = processor([torch.from_numpy(p).permute(2, 0, 1) for p in pictures()], return_tensors="pt")
    assert torch.equal(ours["image_grid"], want["image_grid_thw"])
    torch.testing.assert_close(ours["images"], want["pixel_values"], atol=1e-5, rtol=0)


def test_greedy_generation_equals_transformers(checkpoint):
    hf, path = checkpoint
    model, cfg, _ = load_hf_model(path)
    tokens, pixels = inputs(cfg)
    ours = generate(model, tokens, 8, temperature=0,
                    inputs={"images": pixels["images"], "image_grid": pixels["image_grid"]})
    vision = (tokens == IMG) | (tokens == START) | (tokens == END)
    want = hf.generate(input_ids=tokens, pixel_values=pixels["images"], image_grid_thw=pixels["image_grid"],
                       mm_token_type_ids=(tokens == IMG).long(), moe_mm_token_type_ids=vision.long(),
                       attention_mask=torch.ones_like(tokens), max_new_tokens=8, do_sample=False, eos_token_id=None,
                       pad_token_id=0)
    assert torch.equal(ours, want)


def test_export_gives_transformers_our_logits(checkpoint, tmp_path):
    _, path = checkpoint
    model, cfg, _ = load_hf_model(path)
    with torch.no_grad():  # ours, changed, so that the export is not a copy of the files read
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
        for name, buffer in model.named_buffers():
            if name.endswith("expert_bias"):
                buffer.add_(0.1 * torch.randn_like(buffer))
    assert get_model("vlm").hf.export_family(cfg, True, None) == "ernie4_5_vl_moe"
    get_model("vlm").hf.save(model, "ernie4_5_vl_moe", tmp_path / "out", cfg)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["text_config"]["rope_parameters"]["mrope_section"] == [3, 3, 2]
    hf = transformers.Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    tokens, pixels = inputs(cfg)
    with torch.no_grad():
        ours = model(tokens, images=pixels["images"], image_grid=pixels["image_grid"])
        torch.testing.assert_close(ours, theirs(hf, tokens, pixels), atol=1e-4, rtol=0)


def test_convert_round_trips(checkpoint, tmp_path):
    from longboat.recipes.artifact import open_artifact
    from longboat.recipes.convert import hf_to_longboat, longboat_to_hf

    hf, path = checkpoint
    assert open_artifact(path).hf_family == "ernie4_5_vl_moe"
    hf_to_longboat(path, tmp_path / "export")
    longboat_to_hf(tmp_path / "export", tmp_path / "back")
    back = transformers.Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(tmp_path / "back").eval()
    _, cfg, _ = load_hf_model(path)
    tokens, pixels = inputs(cfg)
    with torch.no_grad():
        assert torch.equal(theirs(back, tokens, pixels), theirs(hf, tokens, pixels))


@pytest.mark.parametrize("text, vision, message", [
    ({"use_bias": True}, {}, "use_bias"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2]}}, {},
     "mrope_section"),
    ({"mlp_layer_types": ["dense", "mixed"]}, {}, "mlp_layer_types"),
    ({}, {"hidden_act": "relu"}, "hidden_act"),
])
def test_what_the_model_cannot_represent_is_refused(tmp_path, text, vision, message):
    config = hf_model().config.to_dict()
    config["text_config"].update(text)
    config["vision_config"].update(vision)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFConversionError, match=message) as e:
        load_hf_model(tmp_path)
    assert "\n" not in str(e.value)
