"""The ``preference`` task: a packed pair equals two separate forwards, the precomputed reference equals the live
one bitwise and is re-computed when the pairs change, LoRA's adapters-off reference is the base model, a frozen copy
gives the precomputed reference's results and resumes from its kept starting weights, bad inputs end in one line, and
a run trains, logs the metrics users know, resumes exactly and exports."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longboat.config.base import ConfigError
from longboat.data.chat.sources import ChatDataError
from longboat.models.lora import LoRAConfig, adapters_disabled, apply_lora
from longboat.recipes import train
from longboat.recipes.config import resolve
from longboat.tasks.preference import REFERENCE_DIR, REFERENCE_FILE, _adapters_off_reference, compute_reference
from longboat.tasks.preference_loss import PreferenceLoss
from longboat.trainer.metrics import read_metrics
from longboat.trainer.trainer import DataParallel

TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "sft" / "tokenizer"
MODEL = {"arch": "decoder", "preset": "tiny", "vocab_size": 512, "d_model": 32, "n_layers": 2, "n_heads": 4,
         "n_kv_heads": 2, "ffn_dim": 64, "max_seq_len": 128}
WORDS = ["sail", "mast", "tide", "helm", "keel", "deck", "port", "oar", "rope", "knot", "wave", "gull"]


def write_pairs(path: Path, n: int = 48, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        w = rng.choice(WORDS)
        rows.append({"prompt": f"Spell {w} backwards.", "chosen": f"{w[::-1]}.", "rejected": f"{w}."})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(tmp_path: Path, pairs: Path, steps: int = 6, **data) -> dict:
    return {
        "task": "preference", "run_dir": str(tmp_path / "run"), "model": dict(MODEL),
        "data": {"tokenizer": str(TOKENIZER), "sources": [str(pairs)], "seq_len": 128, "beta": 0.5, **data},
        "train": {"steps": steps, "micro_batch_size": 2, "optimizer": {"lr": 3e-3, "weight_decay": 0.0},
                  "schedule": {"kind": "constant"},  # the same at every step, whatever train.steps says
                  "log_every": 1, "eval_every": 0, "eval_batches": 1, "num_workers": 0, "threads": 1,
                  "tensorboard": False},
        "checkpoint": {"every": 3, "keep": 5, "export": True},
    }


def built(tmp_path, pairs, **data):
    resolved = resolve(config(tmp_path, pairs, **data))
    task_data = resolved.task.build(resolved.model, resolved.cfg.train, 0, 1)
    return resolved, task_data


def batch_of(rows, indices):
    items = [rows[i] for i in indices]
    return {k: torch.stack([item[k] for item in items]) for k in items[0]}


def test_a_packed_pair_equals_two_separate_forwards(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=8)
    packed_run, packed = built(tmp_path, pairs, loss="simpo")
    _, unpacked = built(tmp_path, pairs, loss="simpo", packing=False)
    assert len(packed.train) < len(unpacked.train) == 8
    torch.manual_seed(0)
    model = packed_run.spec.build(packed_run.model)
    results = []
    for rows, loss_fn in ((packed.train, packed.loss_fn), (unpacked.train, unpacked.loss_fn)):
        model.zero_grad()
        out = loss_fn(model, batch_of(rows, range(len(rows))))
        out.loss_sum.backward()
        results.append((out.loss_sum.detach(), out.count, [p.grad.clone() for p in model.parameters()]))
    (loss_a, n_a, grads_a), (loss_b, n_b, grads_b) = results
    assert n_a == n_b == 8
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_precomputed_reference_equals_the_live_one_bitwise(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=12)
    resolved, data = built(tmp_path, pairs, reference="adapters_off")
    torch.manual_seed(0)
    model = resolved.spec.build(resolved.model)
    apply_lora(model, LoRAConfig(rank=2, targets=["wq", "wv"]))  # B = 0: the starting model is the base
    rows = data.train
    table = compute_reference(model, [rows], 2, torch.device("cpu"), DataParallel())
    for start in range(0, len(rows), 2):
        batch = batch_of(rows, range(start, min(start + 2, len(rows))))
        policy_ids = batch["pair_ids"][batch["pair_ids"] >= 0].unique()
        live = _adapters_off_reference(model, batch, type("P", (), {"ids": policy_ids})())
        assert torch.equal(live, table[policy_ids])


def test_the_adapters_off_reference_is_the_base_model():
    from longboat.models import build_model

    fields = {k: v for k, v in MODEL.items() if k not in ("arch", "preset")}
    base = build_model("decoder", fields)
    adapted = build_model("decoder", fields)
    adapted.load_state_dict(base.state_dict())
    apply_lora(adapted, LoRAConfig(rank=2))
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if name.endswith("lora_B"):
                p.normal_()
    tokens = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.equal(adapted(tokens), base(tokens))
        with adapters_disabled(adapted) as n:
            assert n == 2 * 7 and torch.equal(adapted(tokens), base(tokens))
        assert not torch.equal(adapted(tokens), base(tokens))  # back on


def test_the_reference_cache_follows_the_pairs_and_a_resume_never_recomputes_it(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=8)
    resolved, data = built(tmp_path, pairs)
    model = resolved.spec.build(resolved.model)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    resolved.task.before_training(model, run_dir, torch.device("cpu"), DataParallel(), resumed=False)
    first = load_file(run_dir / REFERENCE_FILE)
    resolved.task.before_training(model, run_dir, torch.device("cpu"), DataParallel(), resumed=True)  # read back
    assert torch.equal(resolved.task.reference_logps, first["logps"])
    write_pairs(pairs, n=8, seed=1)  # other pairs: the cache no longer fits them
    changed, _ = built(tmp_path, pairs)
    with pytest.raises(ConfigError, match="missing or were computed for other data"):
        changed.task.before_training(model, run_dir, torch.device("cpu"), DataParallel(), resumed=True)
    changed.task.before_training(model, run_dir, torch.device("cpu"), DataParallel(), resumed=False)
    assert not torch.equal(load_file(run_dir / REFERENCE_FILE)["key"], first["key"])


def test_adapters_off_without_lora_is_refused(tmp_path):
    resolved, _ = built(tmp_path, write_pairs(tmp_path / "pairs.jsonl", n=4), reference="adapters_off")
    with pytest.raises(ConfigError, match="adapters_off .* but the model has none"):
        resolved.task.before_training(resolved.spec.build(resolved.model), tmp_path, torch.device("cpu"),
                                      DataParallel(), False)


@pytest.mark.parametrize("rows, message", [
    ([{"prompt": "p", "chosen": "a"}] * 4, r"missing fields × 4 \(rows 1, 2, 3, ...\)"),
    ([{"prompt": "Spell oar.", "chosen": "rao", "rejected": "rao"}] * 4, "identical answers × 4"),
    ([{"prompt": "Spell oar.", "chosen": "rao " * 60, "rejected": "oar " * 60}] * 4,
     "answers longer than seq_len × 4"),
])
def test_bad_pairs_end_in_one_line(tmp_path, rows, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ChatDataError, match=message) as e:
        built(tmp_path, path)
    assert "\n" not in str(e.value)


def test_a_loss_that_needs_a_reference_refuses_none(tmp_path):
    with pytest.raises(ConfigError, match="loss dpo compares against a reference"):
        resolve(config(tmp_path, tmp_path / "x.jsonl", reference="none"))
    assert resolve(config(tmp_path, tmp_path / "x.jsonl", loss="simpo")).task.data.reference == "none"


@pytest.mark.slow
def test_a_run_trains_logs_the_usual_metrics_resumes_exactly_and_exports(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    straight = config(tmp_path / "a", pairs)
    train.run(resolve(straight))
    metrics = read_metrics(Path(straight["run_dir"]))
    keys = {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
            "logps/rejected", "pairs_per_s"}
    assert keys <= set(metrics[-1])
    assert metrics[-1]["loss"] < metrics[0]["loss"] and metrics[-1]["rewards/margins"] > 0
    interrupted = config(tmp_path / "b", pairs, steps=3)
    train.run(resolve(interrupted))
    interrupted["train"]["steps"] = 6
    train.run(resolve(interrupted))
    a = load_file(Path(straight["run_dir"]) / "export" / "model.safetensors")
    b = load_file(Path(interrupted["run_dir"]) / "export" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_frozen_copy_gives_the_precomputed_results_and_resumes_from_its_starting_weights(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=24)
    precomputed = config(tmp_path / "pre", pairs)
    train.run(resolve(precomputed))
    copied = config(tmp_path / "copy", pairs, reference="copy")
    train.run(resolve(copied))
    assert (Path(copied["run_dir"]) / REFERENCE_DIR).is_dir()
    assert not (Path(copied["run_dir"]) / REFERENCE_FILE).exists()
    for key in ("loss", "rewards/margins", "rewards/chosen"):
        ours = [r[key] for r in read_metrics(Path(copied["run_dir"])) if key in r]
        theirs = [r[key] for r in read_metrics(Path(precomputed["run_dir"])) if key in r]
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-5, atol=1e-6, msg=key)
    interrupted = config(tmp_path / "resumed", pairs, steps=3, reference="copy")
    train.run(resolve(interrupted))
    interrupted["train"]["steps"] = 6
    train.run(resolve(interrupted))  # the model now holds step 3's weights; the copy must still be the start
    a = load_file(Path(copied["run_dir"]) / "export" / "model.safetensors")
    b = load_file(Path(interrupted["run_dir"]) / "export" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_copy_without_its_starting_weights_is_refused(tmp_path):
    resolved, _ = built(tmp_path, write_pairs(tmp_path / "pairs.jsonl", n=8), reference="copy")
    model = resolved.spec.build(resolved.model)
    with pytest.raises(ConfigError, match="starting weights of the reference copy are missing"):
        resolved.task.before_training(model, tmp_path / "run", torch.device("cpu"), DataParallel(), resumed=True,
                                      replica=lambda: resolved.spec.build(resolved.model))
    with pytest.raises(ConfigError, match="pipeline stages"):
        resolved.task.before_training(model, tmp_path / "run", torch.device("cpu"), DataParallel(), resumed=False)


@pytest.mark.slow
@pytest.mark.parametrize("data_parallel, reference", [("ddp", "precompute"), ("fsdp", "precompute"),
                                                      ("fsdp", "copy")])
def test_two_gloo_ranks_equal_one_process(tmp_path, data_parallel, reference):
    """The same global batches on 2 ranks (each computing half the reference log-probs, or holding half of the
    reference copy) as in one process with the precomputed reference."""
    from tests.distributed.conftest import train_on_two_ranks

    pairs = write_pairs(tmp_path / "pairs.jsonl", n=32)
    single = config(tmp_path / "one", pairs, steps=4)
    single["train"]["micro_batch_size"] = 4
    train.run(resolve(single))
    double = config(tmp_path / "two", pairs, steps=4, reference=reference)
    double["parallel"] = {"data_parallel": data_parallel}
    one, two = Path(single["run_dir"]), train_on_two_ranks(double, tmp_path)
    if reference == "precompute":
        torch.testing.assert_close(load_file(two / REFERENCE_FILE)["logps"],
                                   load_file(one / REFERENCE_FILE)["logps"], rtol=0, atol=1e-5)
    for key in ("loss", "rewards/margins", "logps/chosen"):
        ours = [r[key] for r in read_metrics(two) if key in r]
        theirs = [r[key] for r in read_metrics(one) if key in r]
        assert len(ours) == 4
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-4, atol=1e-5, msg=key)


def test_an_moe_models_aux_loss_is_added_in_training(tmp_path):
    moe = dict(MODEL, moe={"d_model": 32, "n_experts": 4, "top_k": 2, "expert_ffn_dim": 16})
    raw = config(tmp_path, write_pairs(tmp_path / "pairs.jsonl", n=8), loss="simpo")
    raw["model"] = moe
    resolved = resolve(raw)
    data = resolved.task.build(resolved.model, resolved.cfg.train, 0, 1)
    torch.manual_seed(0)
    model = resolved.spec.build(resolved.model)
    batch = batch_of(data.train, range(len(data.train)))
    model.train()
    trained = data.loss_fn(model, batch)
    model.eval()
    evaluated = data.loss_fn(model, batch)
    assert "aux_loss" in trained.metrics and "aux_loss" not in evaluated.metrics
    expected = evaluated.loss_sum + trained.metrics["aux_loss"] * trained.count
    torch.testing.assert_close(trained.loss_sum, expected, rtol=1e-5, atol=1e-6)
