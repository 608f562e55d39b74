"""SmolVLM (and Idefics3) checkpoints in and out: a tiny random transformers SmolVLM (SigLIP tower, pixel-shuffle
connector, Llama decoder) imports with transformers' logits and greedy continuation, a tiny random model of ours
saved as ``smolvlm`` gives transformers the same logits, ``longboat convert`` round-trips the tensors byte for
byte, and what the layout cannot hold is refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from longboat.models import get_model, hf_spec
from longboat.models.llm.generation import generate
from longboat.models.llm.hf import HFConversionError, load_hf_model, save_hf_model
from tests.models.vlm.conftest import IMAGE_TOKEN, vlm_config

transformers = pytest.importorskip("transformers")

VISION_HF = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
             "image_size": 16, "patch_size": 4}
TEXT_HF = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
SIGLIP = {"arch": "siglip", "image_size": 16, "patch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 2}
PER_IMAGE = (16 // 4 // 2) ** 2  # a 4×4 patch grid, pixel-shuffled by 2


def inputs():
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(IMAGE_TOKEN + 1, 64, (2, 12), generator=g)
    tokens[0, 2:2 + PER_IMAGE] = IMAGE_TOKEN
    tokens[1, 6:6 + PER_IMAGE] = IMAGE_TOKEN
    return tokens, torch.randn(2, 3, 16, 16, generator=g)


def hf_logits(hf, tokens, images):
    """transformers' logits for one full-size image a row (its 5-D pixel layout, a full pixel mask)."""
    pixels = images[:, None]
    mask = torch.ones(len(images), 1, 16, 16, dtype=torch.bool)
    return hf(input_ids=tokens, pixel_values=pixels, pixel_attention_mask=mask).logits


def perturbed(model):
    with torch.no_grad():  # away from the initial values (unit norms, zero biases), so every tensor matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def tiny_hf(family="smolvlm", tied=False, **changes):
    classes = {"smolvlm": (transformers.SmolVLMConfig, transformers.SmolVLMForConditionalGeneration),
               "idefics3": (transformers.Idefics3Config, transformers.Idefics3ForConditionalGeneration)}
    config_cls, model_cls = classes[family]
    vision = {**VISION_HF, **changes.pop("vision", {})}
    torch.manual_seed(0)
    config = config_cls(vision_config=vision, text_config=dict(TEXT_HF), image_token_id=IMAGE_TOKEN, scale_factor=2,
                        tie_word_embeddings=tied, **changes)
    return perturbed(model_cls(config))


@pytest.mark.parametrize("family, tied", [("smolvlm", False), ("smolvlm", True), ("idefics3", False)])
def test_import_gives_transformers_logits(tmp_path, family, tied):
    hf = tiny_hf(family, tied)
    hf.save_pretrained(tmp_path / "hf")
    assert hf_spec(tmp_path / "hf").name == "vlm"
    model, cfg, got = load_hf_model(tmp_path / "hf")
    assert got == family and cfg.vision.arch == "siglip" and cfg.projector.kind == "pixel_shuffle"
    assert cfg.language.tie_embeddings is tied and cfg.image_tokens(16, 16) == PER_IMAGE
    tokens, images = inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, images=images), hf_logits(hf, tokens, images), atol=1e-4, rtol=0)


def test_configs_saved_with_only_changed_keys_read_with_transformers_defaults():
    """As older SmolVLM checkpoints (SmolVLA's backbone among them) are saved: the vision config holds only what
    differs from transformers' defaults, the text config some keys no Llama reads, the processor's first resize."""
    from longboat.models.vlm.smolvlm_hf import SmolVLMAdapter

    text = {**TEXT_HF, "head_dim": 8, "rms_norm_eps": 1e-5, "qk_layer_norms": False, "pixel_shuffle_factor": 4,
            "use_resampler": False, "architectures": ["VLlama3ForCausalLM"]}
    vision = {"model_type": "smolvlm_vision", "hidden_size": 768, "num_attention_heads": 12, "patch_size": 16,
              "image_size": 512, "size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}
    fields = SmolVLMAdapter().config_from_hf({"model_type": "smolvlm", "scale_factor": 4, "image_token_id": 49,
                                              "text_config": text, "vision_config": vision})
    cfg = vlm_config(fields["vision"], fields["projector"])
    assert (cfg.vision.n_layers, cfg.vision.mlp_ratio, cfg.vision.norm_eps) == (12, 3072 / 768, 1e-6)
    assert cfg.image_tokens(512, 512) == 64 and cfg.image_processor().longest_edge == 2048
    assert fields["language"]["norm_eps"] == 1e-5 and fields["language"]["n_layers"] == 2


def test_greedy_generation_equals_transformers(tmp_path):
    hf = tiny_hf()
    hf.save_pretrained(tmp_path / "hf")
    model, _, _ = load_hf_model(tmp_path / "hf")
    tokens, images = inputs()
    ours = generate(model, tokens, 8, temperature=0.0, inputs={"images": images})
    hf.generation_config.eos_token_id = None  # eight tokens both ways, whatever they are
    theirs = hf.generate(input_ids=tokens, pixel_values=images[:, None],
                         pixel_attention_mask=torch.ones(2, 1, 16, 16, dtype=torch.bool), max_new_tokens=8,
                         do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("tied", [False, True])
def test_export_gives_transformers_our_logits(tmp_path, tied):
    torch.manual_seed(0)
    model = perturbed(get_model("vlm").build(vlm_config(SIGLIP, {"kind": "pixel_shuffle"}, tie_embeddings=tied)))
    save_hf_model(model, "smolvlm", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "smolvlm" and config["scale_factor"] == 2
    assert config["text_config"]["model_type"] == "llama" and config["tie_word_embeddings"] is tied
    hf = transformers.SmolVLMForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    tokens, images = inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, images=images), hf_logits(hf, tokens, images), atol=1e-4, rtol=0)


def test_convert_round_trips_byte_equal(tmp_path):
    from longboat.recipes.artifact import open_artifact
    from longboat.recipes.convert import hf_to_longboat, longboat_to_hf

    hf = tiny_hf()
    hf.save_pretrained(tmp_path / "hf")
    hf_to_longboat(tmp_path / "hf", tmp_path / "export")
    longboat_to_hf(tmp_path / "export", tmp_path / "back")  # the family this layout exports as by default
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "smolvlm"
    before, after = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert before.keys() == after.keys()
    for name, t in before.items():
        assert t.dtype == after[name].dtype and torch.equal(t.view(torch.uint8), after[name].view(torch.uint8)), name
    artifact = open_artifact(tmp_path / "hf")
    tokens, images = inputs()
    with torch.no_grad():
        assert torch.equal(artifact.model(tokens, images=images), hf_logits(hf, tokens, images))


def test_what_the_layout_cannot_hold_is_refused(tmp_path):
    tiny_hf(vision={"hidden_act": "gelu"}).save_pretrained(tmp_path / "act")
    with pytest.raises(HFConversionError, match="hidden_act='gelu'"):
        load_hf_model(tmp_path / "act")
    config = json.loads((tmp_path / "act" / "config.json").read_text())
    config["vision_config"] |= {"hidden_act": "gelu_pytorch_tanh", "image_size": [16, 20]}
    (tmp_path / "act" / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFConversionError, match=r"vision_config.image_size=\[16, 20\]"):
        load_hf_model(tmp_path / "act")
    with pytest.raises(HFConversionError, match="projector.kind 'pixel_shuffle', not 'mlp'"):
        save_hf_model(get_model("vlm").build(vlm_config(SIGLIP)), "smolvlm", tmp_path / "o")
    vit = {**SIGLIP, "arch": "vit"}
    with pytest.raises(HFConversionError, match="vision.arch 'siglip'"):
        save_hf_model(get_model("vlm").build(vlm_config(vit, {"kind": "pixel_shuffle"})), "smolvlm", tmp_path / "o")
