"""HF import shard file by shard file: each tensor read once, stacked experts completed across files, the target
dtype on arrival, buffers no checkpoint holds recomputed after the meta-device build."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import longboat.models.llm.hf.stream as stream
from longboat.models.llm.hf import HFConversionError, HFWeights, hf_model_config, load_hf_model, read_hf_state_dict
from longboat.models.llm.rope import rope_tables

transformers = pytest.importorskip("transformers")

TOKENS = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))


FILES = 5


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> tuple[Path, torch.Tensor]:
    """A random Qwen3-MoE saved by transformers, its tensors then dealt round-robin over five shard files so that
    each layer's experts span several; and its logits on TOKENS."""
    out = tmp_path_factory.mktemp("moe")
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=96, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
        max_position_embeddings=64, intermediate_size=40, moe_intermediate_size=16, num_hidden_layers=2,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.uniform_(0.5, 1.5)
        logits = model(TOKENS).logits
    model.save_pretrained(out)
    state = read_hf_state_dict(out)
    for f in out.glob("model*.safetensors*"):
        f.unlink()
    names = [f"model-{i + 1:05d}-of-{FILES:05d}.safetensors" for i in range(FILES)]
    weight_map = {key: names[i % FILES] for i, key in enumerate(sorted(state))}
    for name in names:
        save_file({k: state[k].contiguous() for k, f in weight_map.items() if f == name}, out / name)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out, logits


class ReadLog:
    """The real ``safe_open``, recording every tensor read from every file."""

    def __init__(self):
        self.reads: list[tuple[str, str]] = []

    def __call__(self, path, **kw):
        handle, log = safe_open(path, **kw), self

        class Spy:
            def __enter__(self):
                handle.__enter__()
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc)

            def keys(self):
                return handle.keys()

            def get_slice(self, name):
                return handle.get_slice(name)

            def get_tensor(self, name):
                log.reads.append((Path(path).name, name))
                return handle.get_tensor(name)

        return Spy()


def test_every_tensor_is_read_once_file_by_file_into_the_target_dtype(moe_dir, monkeypatch):
    src, expected = moe_dir
    files = sorted(p.name for p in src.glob("*.safetensors"))
    log = ReadLog()
    monkeypatch.setattr(stream, "safe_open", log)

    half, cfg, _ = load_hf_model(src, dtype="bfloat16")
    assert {t.dtype for t in half.state_dict().values() if t.is_floating_point()} == {torch.bfloat16}
    stored = {name for f in files for name in safe_open(src / f, framework="pt").keys()}
    assert Counter(name for _, name in log.reads) == Counter(stored)  # each one read exactly once
    order = [files.index(f) for f, _ in log.reads]
    assert order == sorted(order)  # one file after another, never back
    cos, sin = rope_tables(cfg.max_seq_len, cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling)
    assert torch.equal(half.rope_cos, cos) and torch.equal(half.rope_sin, sin)  # recomputed, not meta
    assert all(not m.load_since_update.is_meta for m in half.modules() if hasattr(m, "load_since_update"))

    ours, _, _ = load_hf_model(src, dtype="float32")
    with torch.no_grad():
        torch.testing.assert_close(ours(TOKENS), expected, atol=1e-4, rtol=1e-4)


def test_stacked_experts_arrive_with_the_file_that_completes_them(moe_dir):
    src, _ = moe_dir
    adapter, cfg = hf_model_config(src)
    weights = HFWeights(src, adapter, cfg)
    where = {name: i for i, path in enumerate(weights.files) for name in safe_open(path, framework="pt").keys()}
    seen = {}
    for i, group in enumerate(weights.groups(torch.bfloat16)):
        assert all(t.dtype == torch.bfloat16 for t in group.values())
        seen |= {name: i for name in group}
    # The files group by group: a file that completes nothing yields nothing, so compare completion order.
    last_file = {ours: max(where[name] for name in parts) for ours, parts in weights.parts.items()}
    assert sorted(seen) == sorted(last_file)
    stacked = "layers.0.feed_forward.experts.w13"
    assert len({where[name] for name in weights.parts[stacked]}) > 1  # its experts lie in several files
    ranks = sorted(set(last_file.values()))
    assert all(seen[k] == ranks.index(last_file[k]) for k in seen)


def test_a_corrupt_shard_is_named_before_any_tensor_is_read(moe_dir, tmp_path):
    shutil.copytree(moe_dir[0], tmp_path, dirs_exist_ok=True)
    shard = sorted(tmp_path.glob("*.safetensors"))[2]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(HFConversionError, match=f"{shard.name}: not a readable safetensors file"):
        load_hf_model(tmp_path)


def test_an_unsupported_dtype_is_named_with_its_file(moe_dir, tmp_path):
    shutil.copytree(moe_dir[0], tmp_path, dirs_exist_ok=True)
    shard = sorted(tmp_path.glob("*.safetensors"))[1]
    state = {k: v.to(torch.float8_e4m3fn) for k, v in load_file(shard).items()}
    save_file(state, shard)
    with pytest.raises(HFConversionError, match=f"{shard.name}: tensor .* has dtype F8_E4M3, which longboat does not"):
        load_hf_model(tmp_path)
