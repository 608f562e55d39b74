"""The dense families' adapters (Llama, Mistral, Qwen2, Qwen3): logits equal to transformers both ways, and every
config option a family cannot represent named on import."""

from __future__ import annotations

import json

import pytest
import torch

from longboat.models.llm.hf import HFConversionError, load_hf_model, save_hf_model
from tests.models.llm.hf.test_io import CASES, TOKENS, _edit_config, hf_logits, save_hf

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("case", list(CASES))
def test_import_and_export_match_transformers(case, tmp_path):
    src, expected = save_hf(tmp_path, case)
    ours, cfg, family = load_hf_model(src)
    assert family == CASES[case][0] and cfg.tie_embeddings == CASES[case][1].get("tie_word_embeddings", False)
    with torch.no_grad():
        got = ours(TOKENS)
    assert expected.abs().mean() > 0.1
    assert (got - expected).abs().max().item() <= 1e-4

    out = save_hf_model(ours, family, tmp_path / "out", max_shard_size="40KB")
    assert (out / "model.safetensors.index.json").is_file()  # several shards
    names = set(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"])
    assert ("lm_head.weight" in names) != cfg.tie_embeddings
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(back).__name__ == json.loads((out / "config.json").read_text())["architectures"][0]
    assert (hf_logits(back) - got).abs().max().item() <= 1e-4


@pytest.mark.parametrize("model_type, change, message", [
    ("llama", dict(rope_parameters=dict(rope_type="longrope", rope_theta=1e4, factor=2.0)), "rope_type 'longrope'"),
    ("llama", dict(rope_scaling=dict(type="dynamic", factor=2.0), rope_parameters=None), "rope_type 'dynamic'"),
    ("llama", dict(attention_bias=True), "attention_bias=True"),
    ("llama", dict(mlp_bias=True), "mlp_bias=True"),
    ("llama", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("qwen2", dict(head_dim=32), "head_dim=32"),
    ("qwen2", dict(use_sliding_window=True), "use_sliding_window=True"),
])
def test_unsupported_options_are_named(tmp_path, model_type, change, message):
    src, _ = save_hf(tmp_path, {"llama": "llama2-mha-untied", "qwen2": "qwen2-bias-gqa2-tied"}[model_type])
    _edit_config(src, **change)
    with pytest.raises(HFConversionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_hf_model(src)
