"""LLaVA checkpoints in and out: a tiny random model of ours saved as ``llava`` gives transformers'
``LlavaForConditionalGeneration`` the same logits, a tiny random transformers LLaVA (SigLIP tower, Llama decoder)
saved with ``save_pretrained`` imports with the same logits, and what LLaVA would read differently is refused by
name."""

from __future__ import annotations

import json

import pytest
import torch

from longboat.models import get_model, hf_spec
from longboat.models.llm.hf import HFConversionError, load_hf_model, save_hf_model
from tests.models.vlm.conftest import IMAGE_TOKEN, vlm_config

transformers = pytest.importorskip("transformers")

VISION = {"arch": "vit", "image_size": 16, "patch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 2,
          "final_norm": False}


def inputs():
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(IMAGE_TOKEN + 1, 64, (2, 24), generator=g)
    tokens[0, 2:18] = IMAGE_TOKEN  # 16 patches an image
    tokens[1, 5:21] = IMAGE_TOKEN
    return tokens, torch.randn(2, 3, 16, 16, generator=g)


@pytest.mark.parametrize("tied", [False, True])
def test_export_gives_transformers_our_logits(tmp_path, tied):
    torch.manual_seed(0)
    model = get_model("vlm").build(vlm_config(VISION, tie_embeddings=tied)).eval()
    with torch.no_grad():  # away from the initial values (unit norms, zero biases), so every tensor matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_hf_model(model, "llava", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "llava" and config["text_config"]["model_type"] == "llama"
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    tokens, images = inputs()
    with torch.no_grad():
        ours = model(tokens, images=images)
        theirs = hf(input_ids=tokens, pixel_values=images).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def tiny_llava(**changes):
    config = dict(
        vision_config={"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 16, "patch_size": 4},
        text_config={"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 64},
        image_token_index=IMAGE_TOKEN, vision_feature_layer=-1, vision_feature_select_strategy="full")
    torch.manual_seed(0)
    return transformers.LlavaForConditionalGeneration(transformers.LlavaConfig(**{**config, **changes})).eval()


def test_import_gives_transformers_logits(tmp_path):
    hf = tiny_llava()
    hf.save_pretrained(tmp_path / "hf")
    assert hf_spec(tmp_path / "hf").name == "vlm"
    model, cfg, family = load_hf_model(tmp_path / "hf")
    assert family == "llava" and cfg.vision.final_norm is False and cfg.image_token_id == IMAGE_TOKEN
    tokens, images = inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, images=images), hf(input_ids=tokens, pixel_values=images).logits,
                                   atol=1e-4, rtol=0)


def test_what_llava_reads_differently_is_refused(tmp_path):
    tiny_llava(vision_feature_layer=-2).save_pretrained(tmp_path / "layer")
    with pytest.raises(HFConversionError, match="vision_feature_layer"):
        load_hf_model(tmp_path / "layer")
    model = get_model("vlm").build(vlm_config({**VISION, "final_norm": True}))
    with pytest.raises(HFConversionError, match="vision.final_norm false"):
        save_hf_model(model, "llava", tmp_path / "out")
    with pytest.raises(HFConversionError, match="projector.kind 'mlp'"):
        save_hf_model(get_model("vlm").build(vlm_config(VISION, {"kind": "patch_merger"})), "llava", tmp_path / "o")


def test_convert_round_trips(tmp_path):
    from longboat.recipes.convert import hf_to_longboat, longboat_to_hf

    hf = tiny_llava()
    hf.save_pretrained(tmp_path / "hf")
    hf_to_longboat(tmp_path / "hf", tmp_path / "export")
    longboat_to_hf(tmp_path / "export", tmp_path / "back")
    back = transformers.LlavaForConditionalGeneration.from_pretrained(tmp_path / "back").eval()
    tokens, images = inputs()
    with torch.no_grad():
        assert torch.equal(back(input_ids=tokens, pixel_values=images).logits,
                           hf(input_ids=tokens, pixel_values=images).logits)
