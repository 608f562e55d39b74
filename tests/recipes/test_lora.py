"""LoRA through ``longboat train``: from a tiny HF checkpoint, only the adapters train (and only they have
optimizer state), the exports hold merged weights, the PEFT adapter loads onto the transformers model with the
same logits, a checkpoint exports and opens merged, a resume is exact, and FSDP2 on 2 gloo ranks works."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys

import peft
import pytest
import torch
import torch.distributed.checkpoint as dcp
import transformers
import yaml
from safetensors.torch import load_file

from longboat.checkpoint.dcp import load_model_weights
from longboat.config.base import ConfigError
from longboat.models.llm.hf import hf_model_config, read_hf_weights
from longboat.models.lora import LoRALinear, apply_lora, is_lora_name
from longboat.recipes import train
from longboat.recipes.artifact import open_artifact
from longboat.recipes.config import load_run_config, load_run_dir_config
from longboat.recipes.export import export_run
from longboat.recipes.preflight import preflight
from longboat.trainer.metrics import read_metrics
from tests.distributed.conftest import finish, start

pytestmark = pytest.mark.slow

STEPS = 6
TOKENS = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(7))
LORA = {"rank": 4, "alpha": 8, "targets": ["wq", "wv", "wo", "w2"]}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random Llama saved by transformers, with the corpus tokenizer's vocabulary."""
    from tests.models.llm.hf.test_io import make_hf

    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    make_hf("llama", dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128,
                          rms_norm_eps=1e-6)).save_pretrained(out)
    return out


def write_config(path, run_dir, corpus, hf_dir, *, lora=LORA, **checkpoint):
    tokenizer, prefix = corpus
    cfg = {
        "run_dir": str(run_dir), "model": {"hf": str(hf_dir)},
        "data": {"tokenizer": str(tokenizer), "paths": [prefix], "seq_len": 32},
        "train": {"steps": STEPS, "micro_batch_size": 4, "log_every": 1, "eval_every": 0, "eval_batches": 1,
                  "num_workers": 0, "threads": 1, "tensorboard": False, "optimizer": {"lr": 2e-2},
                  "schedule": {"kind": "constant"}},
        "checkpoint": {"every": 3, "keep": 5, "export_hf": True, **checkpoint},
        "lora": lora,
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def train_run(config) -> str:
    """Train in this process; the console output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        train.run(load_run_config(config))
    return out.getvalue()


def adapted_model(run_dir, checkpoint):
    """Our model with its adapters unmerged, weights from ``checkpoint``."""
    resolved = load_run_dir_config(run_dir)
    model = resolved.spec.build(resolved.model)
    apply_lora(model, resolved.cfg.lora)
    load_model_weights(checkpoint, model)
    return model.eval()


def logits(model) -> torch.Tensor:
    """Next-token logits of ours or of a transformers/PEFT model (whose output holds them in ``.logits``)."""
    with torch.no_grad():
        out = model(TOKENS)
    return out if isinstance(out, torch.Tensor) else out.logits


@pytest.fixture(scope="module")
def run(corpus, hf_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    return tmp / "run", train_run(write_config(tmp / "lora.yaml", tmp / "run", corpus, hf_dir))


def test_only_adapters_train_and_the_base_stays_as_loaded(run, hf_dir):
    run_dir, out = run
    # base: 2 · 512·64 (embeddings, head) + 2 layers · (3·64² + 2·32·64 + 3·64·96 + 2·64) + 64 = 127,296;
    # adapters: 2 layers · rank 4 · ((64+64) wq + (64+32) wv + (64+64) wo + (96+64) w2) = 4,096
    assert "decoder 131.4K parameters (4.1K trainable, 127.3K frozen) · LoRA rank 4" in out, out
    last = run_dir / "checkpoints" / f"step_{STEPS:08d}"
    model = adapted_model(run_dir, last)
    adapter, cfg = hf_model_config(hf_dir)
    base = read_hf_weights(hf_dir, adapter, cfg)
    state = model.state_dict()
    assert {k for k in state if not is_lora_name(k)} == set(base)
    for name, value in base.items():  # frozen: bitwise the HF weights
        torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)
    b = [v for k, v in state.items() if k.endswith("lora_B")]
    assert len(b) == 2 * 4 and all(v.abs().max() > 1e-3 for v in b)  # every adapter trained away from zero
    losses = [r["loss"] for r in read_metrics(run_dir) if "loss" in r]
    assert losses[-1] < losses[0]


def test_exports_are_merged_and_match_the_adapted_model_and_peft(run, hf_dir):
    run_dir, _ = run
    adapted = logits(adapted_model(run_dir, run_dir / "checkpoints" / f"step_{STEPS:08d}"))
    base_hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    assert (adapted - logits(base_hf)).abs().max() > 1e-2  # training changed the function

    export = open_artifact(run_dir / "export")
    assert not any(isinstance(m, LoRALinear) for m in export.model.modules())
    meta = json.loads((run_dir / "export" / "longboat_config.json").read_text())
    assert meta["lora_merged"] == {"rank": 4, "alpha": 8.0, "dropout": 0.0, "targets": LORA["targets"],
                                   "rslora": False}
    torch.testing.assert_close(logits(export.model), adapted, rtol=0, atol=1e-5)

    hf_export = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "hf", dtype=torch.float32).eval()
    torch.testing.assert_close(logits(hf_export), adapted, rtol=0, atol=1e-5)

    config = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(hf_dir)
    assert sorted(config["target_modules"]) == ["down_proj", "o_proj", "q_proj", "v_proj"]
    peft_model = peft.PeftModel.from_pretrained(base_hf, run_dir / "adapter").eval()
    torch.testing.assert_close(logits(peft_model), adapted, rtol=0, atol=1e-5)


def test_a_checkpoint_opens_and_exports_merged(run, tmp_path):
    run_dir, _ = run
    checkpoint = run_dir / "checkpoints" / "step_00000003"
    expected = logits(adapted_model(run_dir, checkpoint))
    artifact = open_artifact(checkpoint)
    assert artifact.folded["lora"]["rank"] == 4 and not any(isinstance(m, LoRALinear) for m in artifact.model.modules())
    torch.testing.assert_close(logits(artifact.model), expected, rtol=0, atol=1e-5)
    out = export_run(checkpoint, tmp_path / "exported")
    assert json.loads((out / "longboat_config.json").read_text())["lora_merged"]["rank"] == 4
    torch.testing.assert_close(logits(open_artifact(out).model), expected, rtol=0, atol=1e-5)


def saved_tensors(checkpoint) -> dict[str, torch.Tensor]:
    """Every tensor a checkpoint holds (model, optimizer state), by its DCP key."""
    meta = dcp.FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    state = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in meta.items() if hasattr(v, "size")}
    dcp.load(state, checkpoint_id=checkpoint)
    return state


def test_resume_is_exact_and_only_adapters_have_optimizer_state(run, corpus, hf_dir, tmp_path):
    """Cut the run back to its step-3 checkpoint and rerun it: the same losses, adapters, optimizer and export."""
    run_dir, _ = run
    again = tmp_path / "run"
    shutil.copytree(run_dir, again, ignore=shutil.ignore_patterns("step_00000006", "export", "hf", "adapter"))
    out = train_run(write_config(tmp_path / "lora.yaml", again, corpus, hf_dir))
    assert f"resumed from {again / 'checkpoints' / 'step_00000003'} at step 3" in out
    first, resumed = read_metrics(run_dir), read_metrics(again)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6, 4, 5, 6]
    assert [r["loss"] for r in resumed[-3:]] == [r["loss"] for r in first[-3:]]

    expected, got = load_file(run_dir / "export" / "model.safetensors"), load_file(again / "export" / "model.safetensors")
    assert expected.keys() == got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=key)
    expected = saved_tensors(run_dir / "checkpoints" / "step_00000006")
    got = saved_tensors(again / "checkpoints" / "step_00000006")
    assert expected.keys() == got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=key)
    optim = {k.removeprefix("train.optim.state.").rpartition(".")[0] for k in expected
             if k.startswith("train.optim.state.")}
    lora = {k.removeprefix("train.model.") for k in expected if k.startswith("train.model.") and is_lora_name(k)}
    assert optim == lora and len(lora) == 16  # the optimizer holds the adapters and nothing else


def test_lora_config_mistakes_fail_before_training(corpus, hf_dir, tmp_path):
    bad = load_run_config(write_config(tmp_path / "bad.yaml", tmp_path / "bad", corpus, hf_dir,
                                       lora={"targets": ["wq", "embed_tokens"]}))
    with pytest.raises(ConfigError, match="lora.targets: 'embed_tokens' matches no module"):
        preflight(bad, 1)
    tp = load_run_config(write_config(tmp_path / "tp.yaml", tmp_path / "tp", corpus, hf_dir))
    tp.cfg.parallel.tp = 2
    with pytest.raises(ConfigError, match=r"LoRA does not combine with tensor parallelism \(parallel.tp=2\)"):
        preflight(tp, 2)
    assert not (tmp_path / "bad").exists() and not (tmp_path / "tp").exists()


def test_resuming_with_other_adapters_is_refused(run, corpus, hf_dir, tmp_path):
    run_dir, _ = run
    other = load_run_config(write_config(tmp_path / "other.yaml", run_dir, corpus, hf_dir, lora={**LORA, "rank": 8}))
    with pytest.raises(ConfigError, match=r"holds checkpoints .* of another model: lora \{.*'rank': 4"):
        preflight(other, 1)


def test_fsdp2_on_two_ranks_trains_the_adapters_of_a_frozen_base(run, corpus, hf_dir, tmp_path):
    single_dir, _ = run
    config = write_config(tmp_path / "lora.yaml", tmp_path / "run", corpus, hf_dir, every=STEPS)
    log = tmp_path / "train.log"
    proc = start([sys.executable, "-m", "longboat", "train", "--nproc", "2", str(config),
                  "train.micro_batch_size=2"], log)
    out = finish(proc, log, timeout=300)
    assert proc.returncode == 0, out[-6000:]
    assert "mesh dp_replicate 1 × dp_shard 2 × tp 1 (fsdp)" in out and "(4.1K trainable, 127.3K frozen)" in out
    run_dir = tmp_path / "run"
    model = adapted_model(run_dir, run_dir / "checkpoints" / f"step_{STEPS:08d}")
    adapter, cfg = hf_model_config(hf_dir)
    for name, value in read_hf_weights(hf_dir, adapter, cfg).items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0, msg=name)
    # The same global batches as the single process: the same losses, up to reduction order.
    losses = [r["loss"] for r in read_metrics(run_dir) if "loss" in r]
    reference = [r["loss"] for r in read_metrics(single_dir) if "loss" in r]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference), rtol=1e-4, atol=0)
    torch.testing.assert_close(logits(open_artifact(run_dir / "export").model), logits(model), rtol=0, atol=1e-5)
    peft_model = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32), run_dir / "adapter").eval()
    torch.testing.assert_close(logits(peft_model), logits(model), rtol=0, atol=1e-5)
