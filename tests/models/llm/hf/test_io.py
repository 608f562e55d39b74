"""HF checkpoints in and out: sharding, dtype, tokenizer and generation files, training from and exporting to HF
directories, bad input. The families' own parity is in ``tests/models/llm/adapters``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from longboat.models.llm.hf import HFConversionError, hf_families, load_hf_model, save_hf_model

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
            max_position_embeddings=128, rms_norm_eps=1e-6)
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=4.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=32)
CASES = {  # name: (model_type, config kwargs)
    "llama2-mha-untied": ("llama", dict(BASE, num_key_value_heads=4)),
    "llama3-gqa2-tied-scaled": ("llama", dict(BASE, num_key_value_heads=2, tie_word_embeddings=True,
                                              rope_parameters=LLAMA3_ROPE)),
    "mistral-mqa-untied": ("mistral", dict(BASE, num_key_value_heads=1, head_dim=16, sliding_window=4096)),
    "qwen2-bias-gqa2-tied": ("qwen2", dict(BASE, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3-qknorm-wide-heads": ("qwen3", dict(BASE, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)),
}
TOKENS = torch.randint(0, 256, (2, 80), generator=torch.Generator().manual_seed(1))  # 80 > 32: scaled RoPE


def make_hf(model_type: str, kwargs: dict, seed: int = 0):
    """A random transformers model with weights perturbed away from their trivial init."""
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    return model


def hf_logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(TOKENS).logits


def save_hf(tmp_path: Path, case: str, **save_kwargs) -> tuple[Path, torch.Tensor]:
    model = make_hf(*CASES[case])
    out = tmp_path / "hf"
    model.save_pretrained(out, **save_kwargs)
    return out, hf_logits(model)


def test_sharded_hf_input_and_dtype(tmp_path):
    src, expected = save_hf(tmp_path, "qwen2-bias-gqa2-tied", max_shard_size="40KB")
    assert (src / "model.safetensors.index.json").is_file()
    ours, _, _ = load_hf_model(src)
    with torch.no_grad():
        assert (ours(TOKENS) - expected).abs().max().item() <= 1e-4
    half, _, _ = load_hf_model(src, dtype="bfloat16")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    out = save_hf_model(half, "qwen2", tmp_path / "bf16")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}
    again, _, _ = load_hf_model(out)  # stored dtype preserved
    assert {p.dtype for p in again.parameters()} == {torch.bfloat16}


def test_mistral_window_caps_sequence_length(tmp_path):
    model = make_hf("mistral", dict(BASE, num_key_value_heads=2, sliding_window=64))
    model.save_pretrained(tmp_path)
    ours, cfg, _ = load_hf_model(tmp_path)
    assert cfg.max_seq_len == 64
    tokens = TOKENS[:, :64]
    with torch.no_grad():
        assert (ours(tokens) - model(tokens).logits).abs().max().item() <= 1e-4


def test_tokenizer_and_generation_config_carried(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    src, _ = save_hf(tmp_path, "llama2-mha-untied")
    tok = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "a": 2, "[UNK]": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    (src / "generation_config.json").unlink(missing_ok=True)
    ours, _, family = load_hf_model(src)
    out = save_hf_model(ours, family, tmp_path / "out", tokenizer_dir=src)
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 0, "eos_token_id": 1}
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 1


# ---- bad input -------------------------------------------------------------------------------------------


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_bad_directories(tmp_path):
    with pytest.raises(HFConversionError, match="no config.json"):
        load_hf_model(tmp_path)
    src, _ = save_hf(tmp_path, "llama2-mha-untied")
    _edit_config(src, model_type="gpt2")
    with pytest.raises(HFConversionError, match="unknown HF model_type 'gpt2'; known: .*llama.*qwen3"):
        load_hf_model(src)
    assert {"llama", "mistral", "qwen2", "qwen3"} <= set(hf_families())


def test_missing_extra_and_misshapen_tensors(tmp_path):
    src, _ = save_hf(tmp_path, "llama2-mha-untied")
    weights = load_file(src / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k != "model.layers.1.mlp.up_proj.weight"},
              src / "model.safetensors")
    with pytest.raises(HFConversionError, match=r"missing tensors \[model.layers.1.mlp.up_proj.weight\]"):
        load_hf_model(src)
    save_file({**weights, "model.layers.0.extra.weight": torch.zeros(2)}, src / "model.safetensors")
    with pytest.raises(HFConversionError, match=r"unexpected tensors \[model.layers.0.extra.weight\]"):
        load_hf_model(src)
    save_file(weights, src / "model.safetensors")
    _edit_config(src, intermediate_size=128)
    with pytest.raises(HFConversionError, match=r"shape mismatch: model.layers.0.mlp.gate_proj.weight: "
                                                r"checkpoint \(96, 64\), config.json implies \(128, 64\)"):
        load_hf_model(src)


def test_export_refuses_a_family_that_cannot_represent_the_model(tmp_path):
    src, _ = save_hf(tmp_path, "qwen3-qknorm-wide-heads")
    ours, _, _ = load_hf_model(src)
    with pytest.raises(HFConversionError, match="llama has qkv_bias=False, qk_norm=False"):
        save_hf_model(ours, "llama", tmp_path / "out")


# ---- longboat convert and training from an HF directory ---------------------------------------------------


def test_convert_round_trip_through_the_command_line(tmp_path, capsys):
    from longboat.cli.main import main

    src, expected = save_hf(tmp_path, "qwen3-qknorm-wide-heads")
    assert main(["convert", "hf-to-longboat", str(src), str(tmp_path / "export"), "--dtype", "float32"]) == 0
    assert json.loads((tmp_path / "export" / "longboat_config.json").read_text())["hf_family"] == "qwen3"
    assert main(["convert", "longboat-to-hf", str(tmp_path / "export"), str(tmp_path / "back")]) == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(back).__name__ == "Qwen3ForCausalLM"
    assert (hf_logits(back) - expected).abs().max().item() <= 1e-4

    assert main(["convert", "hf-to-longboat", str(src), str(tmp_path / "e16"), "--dtype", "bfloat16"]) == 0
    assert main(["convert", "longboat-to-hf", str(tmp_path / "e16"), str(tmp_path / "h16"), "--family", "qwen3"]) == 0
    assert json.loads((tmp_path / "h16" / "config.json").read_text())["dtype"] == "bfloat16"  # kept

    assert main(["convert", "hf-to-longboat", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_train_from_hf_dir_and_export_hf(corpus, tmp_path):
    from longboat.config.base import load_yaml
    from longboat.recipes import train
    from longboat.recipes.config import resolve

    tokenizer, prefix = corpus
    hf = make_hf("llama", dict(BASE, vocab_size=512, num_key_value_heads=2, tie_word_embeddings=True))
    hf.save_pretrained(tmp_path / "hf")
    raw = load_yaml("configs/pretrain/quickstart.yaml")
    raw.update(run_dir=str(tmp_path / "run"), model={"hf": str(tmp_path / "hf")})
    raw["data"] |= {"tokenizer": str(tokenizer), "paths": [prefix], "seq_len": 64}
    raw["train"] |= {"steps": 2, "micro_batch_size": 2, "eval_every": 0, "tensorboard": False, "threads": 1,
                     "dtype": "fp32", "optimizer": {"lr": 1e-9}}
    raw["checkpoint"] = {"every": 0, "export_hf": True}
    resolved = resolve(raw)
    assert resolved.model.n_kv_heads == 2 and resolved.model.tie_embeddings
    train.run(resolved)
    # With a negligible learning rate the trained model is still the HF one: the weights were loaded.
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf").eval()
    tokens = TOKENS.clamp(max=511)
    with torch.no_grad():
        assert (back(tokens).logits - hf(tokens).logits).abs().max().item() <= 1e-3
    assert (tmp_path / "run" / "export" / "longboat_config.json").is_file()
    assert (tmp_path / "run" / "hf" / "tokenizer.json").is_file()  # the training tokenizer comes along


@pytest.mark.slow
def test_two_rank_fsdp_meta_init_starts_from_hf_weights(corpus, tmp_path):
    import sys

    import yaml

    from longboat.config.base import load_yaml
    from tests.distributed.conftest import finish, start

    tokenizer, prefix = corpus
    hf = make_hf("qwen2", dict(BASE, vocab_size=512, num_key_value_heads=2))
    hf.save_pretrained(tmp_path / "hf")
    raw = load_yaml("configs/pretrain/quickstart.yaml")
    raw.update(run_dir=str(tmp_path / "run"), model={"hf": str(tmp_path / "hf")})
    raw["data"] |= {"tokenizer": str(tokenizer), "paths": [prefix], "seq_len": 64}
    raw["train"] |= {"steps": 1, "micro_batch_size": 2, "eval_every": 0, "tensorboard": False, "threads": 1,
                     "dtype": "fp32", "num_workers": 0, "optimizer": {"lr": 1e-9}}
    raw["checkpoint"] = {"every": 0, "export_hf": "qwen2"}
    raw["parallel"] = {"meta_init": True}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    log = tmp_path / "train.log"
    proc = start([sys.executable, "-m", "longboat", "train", "--nproc", "2", str(tmp_path / "run.yaml")], log)
    out = finish(proc, log, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    assert "(fsdp)" in out
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf").eval()
    tokens = TOKENS.clamp(max=511)
    with torch.no_grad():
        assert (back(tokens).logits - hf(tokens).logits).abs().max().item() <= 1e-3


def _broken_copies(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """HF directories broken one way each: name -> (directory, the file the error must name)."""
    src, _ = save_hf(tmp_path, "llama2-mha-untied")
    out = {}
    for name in ("not_json", "no_hidden_size", "null_hidden_size", "truncated", "bad_index"):
        d = tmp_path / name
        d.mkdir()
        for f in src.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        out[name] = (d, str(d / "config.json"))
    (tmp_path / "not_json" / "config.json").write_text('{"model_type": "llama", hidden_size: 64')
    cfg = json.loads((src / "config.json").read_text())
    del cfg["hidden_size"]
    (tmp_path / "no_hidden_size" / "config.json").write_text(json.dumps(cfg))
    _edit_config(tmp_path / "null_hidden_size", hidden_size=None)
    weights = (src / "model.safetensors").read_bytes()
    (tmp_path / "truncated" / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    out["truncated"] = (tmp_path / "truncated", str(tmp_path / "truncated" / "model.safetensors"))
    (tmp_path / "bad_index" / "model.safetensors.index.json").write_text("{")
    out["bad_index"] = (tmp_path / "bad_index", str(tmp_path / "bad_index" / "model.safetensors.index.json"))
    return out


def test_broken_hf_directories_name_the_file(tmp_path, capsys):
    from longboat.cli.main import main
    from longboat.config.base import load_yaml
    from longboat.errors import LongboatError
    from longboat.recipes.config import resolve

    messages = {"not_json": "config.json", "no_hidden_size": "missing required key 'hidden_size'",
                "null_hidden_size": "malformed llama config", "truncated": "not a readable safetensors file",
                "bad_index": "not valid JSON"}
    broken = _broken_copies(tmp_path)
    capsys.readouterr()
    for name, (hf_dir, file) in broken.items():
        assert main(["convert", "hf-to-longboat", str(hf_dir), str(tmp_path / f"out_{name}")]) == 2, name
        err = capsys.readouterr().err
        assert f"error: {file}" in err and messages[name] in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / f"out_{name}").exists()
        # model: {hf: dir} in a run config reads through the same functions: its config, then its weights.
        raw = load_yaml("configs/pretrain/quickstart.yaml")
        raw.update(run_dir=str(tmp_path / "run"), model={"hf": str(hf_dir)})
        with pytest.raises(LongboatError, match=file.replace(".", r"\.")) as caught:
            resolved = resolve(raw)
            resolved.spec.hf.read_weights(hf_dir, resolved.model)
        assert messages[name] in str(caught.value)
