"""Qwen2.5-VL and Qwen3-VL (dense and MoE) checkpoints in and out: a tiny random transformers
``Qwen2_5_VLForConditionalGeneration``, ``Qwen3VLForConditionalGeneration`` (DeepStack, interleaved multimodal RoPE)
or ``Qwen3VLMoeForConditionalGeneration`` (the same with four experts, two per token) imports with its logits and greedy
generations (two images of odd sizes), ours exports to transformers with ours,
a packed row equals its samples alone, the older flat config.json imports, preprocessor_config.json sets the
tower's images, and what the model cannot represent is refused by name."""

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
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
# Qwen3-VL: a three-block tower with learned positions and DeepStack after blocks 0 and 1; head_dim set apart
QWEN3_VISION = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=16,
                    spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                    deepstack_visual_indexes=[0, 1])
QWEN3_TEXT = {**TEXT, "head_dim": 16, "rope_parameters": {**TEXT["rope_parameters"], "mrope_interleaved": True}}
QWEN3_MOE_TEXT = {**QWEN3_TEXT, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 40}
SIZES = [(47, 83), (61, 39)]  # (height, width) of the two images: odd, one wide and one tall
FAMILIES = ["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"]


def hf_class(family: str):
    return {"qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
            "qwen3_vl": transformers.Qwen3VLForConditionalGeneration,
            "qwen3_vl_moe": transformers.Qwen3VLMoeForConditionalGeneration}[family]


def hf_model(text: dict | None = None, vision: dict | None = None, family: str = "qwen2_5_vl", **top):
    base_vision, base_text = {"qwen2_5_vl": (VISION, TEXT), "qwen3_vl": (QWEN3_VISION, QWEN3_TEXT),
                              "qwen3_vl_moe": (QWEN3_VISION, QWEN3_MOE_TEXT)}[family]
    config = transformers.AutoConfig.for_model(
        family, vision_config={**base_vision, **(vision or {})}, text_config={**base_text, **(text or {})},
        image_token_id=IMG, video_token_id=61, vision_start_token_id=START, vision_end_token_id=END, **top)
    torch.manual_seed(0)
    model = hf_class(family)(config).eval()
    with torch.no_grad():  # away from unit norms and zero biases, so that every tensor matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "hf"
    model = hf_model(family=request.param)
    model.save_pretrained(path)
    return model, path


def images(cfg, sizes=SIZES) -> dict[str, torch.Tensor]:
    g = np.random.default_rng(0)
    pictures = [g.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    return cfg.image_processor()(pictures)


def prompt(counts: list[int], text: int = 3) -> list[int]:
    out = list(range(1, 1 + text))
    for i, n in enumerate(counts):
        out += [START] + [IMG] * n + [END] + list(range(20 + 5 * i, 20 + 5 * i + text))
    return out


def inputs(cfg):
    pixels = images(cfg)
    counts = (pixels["image_grid"].prod(dim=1) // 4).tolist()
    rows = [prompt(counts[:1]) + prompt(counts[1:], text=2), prompt([], text=9)]
    width = max(map(len, rows))
    tokens = torch.tensor([[7] * (width - len(r)) + r for r in rows])  # text in front of the shorter row
    return tokens, pixels


def theirs(hf, tokens, pixels, **kwargs):
    return hf(input_ids=tokens, pixel_values=pixels["images"], image_grid_thw=pixels["image_grid"],
              mm_token_type_ids=(tokens == IMG).long(), **kwargs).logits


def test_import_gives_transformers_logits(checkpoint):
    hf, path = checkpoint
    assert hf_spec(path).name == "vlm"
    model, cfg, family = load_hf_model(path)
    assert family == hf.config.model_type and cfg.language.mrope_section == (2, 3, 3)
    assert cfg.projector.kind == "identity" and cfg.language.mrope_interleaved == (family != "qwen2_5_vl")
    assert (cfg.language.moe is not None) == (family == "qwen3_vl_moe")
    tokens, pixels = inputs(cfg)
    with torch.no_grad():
        ours = model(tokens, images=pixels["images"], image_grid=pixels["image_grid"])
        want = theirs(hf, tokens, pixels)
        torch.testing.assert_close(ours, want, atol=1e-4, rtol=0)
        # without mm_token_type_ids transformers' Qwen2.5-VL falls back to 1-D positions (different logits);
        # its Qwen3-VL (dense and MoE) refuses
        bare = dict(input_ids=tokens, pixel_values=pixels["images"], image_grid_thw=pixels["image_grid"])
        if family == "qwen2_5_vl":
            assert (hf(**bare).logits - want).abs().max() > 1e-3
        else:
            with pytest.raises(ValueError, match="mm_token_type_ids"):
                hf(**bare)
        text = tokens[1:, :12]  # a batch without images
        torch.testing.assert_close(model(text), hf(input_ids=text).logits, atol=1e-4, rtol=0)


def test_greedy_generation_equals_transformers(checkpoint):
    hf, path = checkpoint
    model, cfg, _ = load_hf_model(path)
    tokens, pixels = inputs(cfg)
    tokens = tokens[:1]  # the row with both images
    ours = generate(model, tokens, 8, temperature=0,
                    inputs={"images": pixels["images"], "image_grid": pixels["image_grid"]})
    want = hf.generate(input_ids=tokens, pixel_values=pixels["images"], image_grid_thw=pixels["image_grid"],
                       mm_token_type_ids=(tokens == IMG).long(), attention_mask=torch.ones_like(tokens),
                       max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours, want)


def test_a_rewound_cache_continues_at_the_right_positions(checkpoint):
    """Text fed after a cached prompt with images, and again after the cache is rewound (a chat edited), gives the
    logits of the whole sequence at once."""
    _, path = checkpoint
    model, cfg, _ = load_hf_model(path)
    tokens, pixels = inputs(cfg)
    tokens = tokens[:1]
    k = len(tokens[0]) - 2  # the last image ends 3 tokens before the end
    with torch.no_grad():
        whole = model(tokens, images=pixels["images"], image_grid=pixels["image_grid"])
        cache = model.make_cache(1, 256)
        model(tokens[:, :k], cache=cache, images=pixels["images"], image_grid=pixels["image_grid"])
        model(tokens[:, k:].flip(1), cache=cache)  # another ending, then taken back
        cache.rewind(k)
        torch.testing.assert_close(model(tokens[:, k:], cache=cache), whole[:, k:], atol=1e-5, rtol=0)


def test_packed_row_equals_each_sample_alone(checkpoint):
    _, path = checkpoint
    model, cfg, _ = load_hf_model(path)
    pixels = images(cfg)
    counts = (pixels["image_grid"].prod(dim=1) // 4).tolist()
    first, second = prompt(counts[:1], text=4), prompt(counts[1:], text=2)
    grids, per_image = pixels["image_grid"], pixels["image_grid"].prod(dim=1).tolist()
    split = [pixels["images"][:per_image[0]], pixels["images"][per_image[0]:]]
    row = torch.tensor([first + second + [0, 0]])
    positions = torch.tensor([list(range(len(first))) + list(range(len(second))) + [0, 0]])
    segments = torch.tensor([[1] * len(first) + [2] * len(second) + [0, 0]])
    slots = torch.tensor([[0, first.index(IMG)], [0, len(first) + second.index(IMG)]])
    with torch.no_grad():
        packed = model(row, positions, segments=segments, images=pixels["images"], image_slots=slots,
                       image_grid=grids)
        for start, sample, image, grid in ((0, first, split[0], grids[:1]), (len(first), second, split[1], grids[1:])):
            alone = model(torch.tensor([sample]), images=image, image_grid=grid)
            torch.testing.assert_close(packed[:, start:start + len(sample)], alone, atol=1e-5, rtol=0)


def test_export_gives_transformers_our_logits(checkpoint, tmp_path):
    _, path = checkpoint
    model, cfg, _ = load_hf_model(path)
    with torch.no_grad():  # ours, changed, so that the export is not a copy of the files read
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    hf, _ = checkpoint
    assert get_model("vlm").hf.export_family(cfg, True, None) == hf.config.model_type  # the default for it
    get_model("vlm").hf.save(model, hf.config.model_type, tmp_path / "out", cfg)  # as convert and exports do
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["text_config"]["rope_parameters"]["mrope_section"] == [2, 3, 3]
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "out")  # written beside it
    assert processor.size.longest_edge == cfg.vision.max_pixels
    assert list(processor.image_mean) == list(cfg.vision.image_mean)
    hf = hf_class(hf.config.model_type).from_pretrained(tmp_path / "out").eval()
    tokens, pixels = inputs(cfg)
    with torch.no_grad():
        ours = model(tokens, images=pixels["images"], image_grid=pixels["image_grid"])
        torch.testing.assert_close(ours, theirs(hf, tokens, pixels), atol=1e-4, rtol=0)


def test_flat_config_layout_and_preprocessor_config(checkpoint, tmp_path):
    """The older layout (decoder fields at the top, ``rope_scaling: {type: mrope}``) reads as the new one;
    ``preprocessor_config.json`` gives the pixel bounds and normalisation."""
    hf, path = checkpoint
    if hf.config.model_type != "qwen2_5_vl":
        pytest.skip("the flat layout is Qwen2.5-VL's")
    config = json.loads((path / "config.json").read_text())
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {**config, **text, "model_type": "qwen2_5_vl", "rope_theta": rope["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}}
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "config.json").write_text(json.dumps(flat))
    (tmp_path / "flat" / "model.safetensors").symlink_to(path / "model.safetensors")
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    (tmp_path / "flat" / "preprocessor_config.json").write_text(json.dumps(
        {"min_pixels": 3136, "max_pixels": 50176, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
         "image_mean": mean, "image_std": std}))
    model, cfg, _ = load_hf_model(tmp_path / "flat")
    reference, ref_cfg, _ = load_hf_model(path)
    assert cfg.language == ref_cfg.language and cfg.vision.max_pixels == 50176
    assert cfg.vision.image_mean == tuple(mean) and cfg.vision.image_std == tuple(std)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))


@pytest.mark.parametrize("family, text, vision, message", [
    ("qwen2_5_vl", {"use_sliding_window": True, "sliding_window": 16}, {}, "use_sliding_window"),
    ("qwen2_5_vl", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
                                        "mrope_section": [2, 3, 3]}}, {}, "rope_type 'yarn'"),
    ("qwen2_5_vl", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 2, 2]}}, {},
     "mrope_section"),
    ("qwen2_5_vl", {}, {"out_hidden_size": 48}, "out_hidden_size"),
    ("qwen3_vl", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 3, 3]}}, {},
     "mrope_section"),
    ("qwen3_vl", {}, {"hidden_act": "relu"}, "hidden_act"),
    ("qwen3_vl_moe", {"norm_topk_prob": False}, {}, "norm_topk_prob"),
    ("qwen3_vl_moe", {"hidden_act": "gelu"}, {}, "hidden_act"),
])
def test_what_the_model_cannot_represent_is_refused(tmp_path, family, text, vision, message):
    config = hf_model(family=family).config.to_dict()
    config["text_config"].update(text)
    config["vision_config"].update(vision)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFConversionError, match=message) as e:
        load_hf_model(tmp_path)
    assert "\n" not in str(e.value)


def test_convert_round_trips(checkpoint, tmp_path):
    from longboat.recipes.artifact import open_artifact
    from longboat.recipes.convert import hf_to_longboat, longboat_to_hf

    hf, path = checkpoint
    assert open_artifact(path).hf_family == hf.config.model_type
    hf_to_longboat(path, tmp_path / "export")
    longboat_to_hf(tmp_path / "export", tmp_path / "back")
    back = hf_class(hf.config.model_type).from_pretrained(tmp_path / "back").eval()
    _, cfg, _ = load_hf_model(path)
    tokens, pixels = inputs(cfg)
    with torch.no_grad():
        assert torch.equal(theirs(back, tokens, pixels), theirs(hf, tokens, pixels))


def test_published_expert_layout_imports(checkpoint, tmp_path):
    """The published Qwen3-VL MoE checkpoints store the fused experts transposed ([E, d, 2·ffn], [E, ffn, d]);
    they import with the same weights as the layout transformers writes."""
    from safetensors.torch import load_file, save_file

    hf, path = checkpoint
    if hf.config.model_type != "qwen3_vl_moe":
        pytest.skip("the fused expert layouts are Qwen3-VL MoE's")
    tensors = load_file(path / "model.safetensors")
    fused = [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(fused) == 4
    (tmp_path / "published").mkdir()
    save_file({k: v.transpose(1, 2).contiguous() if k in fused else v for k, v in tensors.items()},
              tmp_path / "published" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "published" / "config.json").write_text((path / "config.json").read_text())
    model, _, _ = load_hf_model(tmp_path / "published")
    reference, _, _ = load_hf_model(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))


def test_export_needs_the_family_decoder(checkpoint):
    """A dense decoder does not export as Qwen3-VL MoE, nor one with experts as a dense family."""
    hf, path = checkpoint
    _, cfg, _ = load_hf_model(path)
    other = "qwen3_vl" if hf.config.model_type == "qwen3_vl_moe" else "qwen3_vl_moe"
    with pytest.raises(HFConversionError, match="language.moe") as e:
        get_model("vlm").hf.export_family(cfg, other, None)
    assert "\n" not in str(e.value)
