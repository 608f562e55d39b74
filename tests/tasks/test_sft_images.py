"""The ``sft`` task with a model that reads images: packed rows train exactly as one sample per row (multimodal RoPE
included), truncation drops a sample rather than cut an image, malformed image rows fail the run past the limit, the
placeholder must be the model's image token, a frozen tower stays bitwise unchanged, and ``longboat train`` runs the
tiny config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from longboat.config.base import ConfigError
from longboat.data.chat.images import ImageChatRows
from longboat.data.chat.sources import ChatDataError
from longboat.recipes.config import load_run_config
from tests.conftest import run_longboat

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "vlm" / "tiny.yaml"
FIXTURE = REPO / "tests" / "fixtures" / "vlm"
SMALL = [f"data.tokenizer={FIXTURE / 'tokenizer'}", f"data.sources=[{FIXTURE / 'shapes.jsonl'}]",
         "model.language.d_model=64", "model.language.ffn_dim=128", "model.vision.d_model=32",
         "train.threads=1", "train.tensorboard=false"]


def resolve(tmp_path, *overrides: str):
    return load_run_config(CONFIG, [f"run_dir={tmp_path / 'run'}", *SMALL, *overrides])


def build(tmp_path, *overrides: str):
    resolved = resolve(tmp_path, *overrides)
    resolved.task.check(resolved.model)
    return resolved, resolved.task.build(resolved.model, resolved.cfg.train, 0, 1)


def loss_and_grads(model, data, batch_size: int = 4):
    """The loss over every row (summed, divided by the count, as the trainer does) and its gradients."""
    model.zero_grad()
    rows = data.train
    total, count = 0.0, 0
    for start in range(0, len(rows), batch_size):
        batch = ImageChatRows.collate([rows[r] for r in range(start, min(start + batch_size, len(rows)))])
        out = data.loss_fn(model, batch)
        out.loss_sum.backward()
        total, count = total + out.loss_sum.detach(), count + int(out.count)
    return total / count, {n: p.grad / count for n, p in model.named_parameters()}


def test_packed_rows_equal_one_sample_per_row(tmp_path, one_thread):
    resolved, packed = build(tmp_path, "data.packing=true")
    share = (packed.train.tokens == resolved.model.image_token_id).mean()
    assert 0.3 < share < 0.7  # 16 image tokens of about 30 a sample
    assert resolved.task.flops_per_unit(resolved.model) == pytest.approx(
        resolved.model.language.flops_per_token(128) + share * resolved.model.flops_per_image_token())
    _, padded = build(tmp_path, "data.packing=false")
    assert len(packed.train) < len(padded.train)
    torch.manual_seed(0)
    model = resolved.spec.build(resolved.model).train()
    loss_p, grads_p = loss_and_grads(model, packed)
    loss_u, grads_u = loss_and_grads(model, padded)
    assert torch.allclose(loss_p, loss_u, atol=1e-5, rtol=0)
    for name, g in grads_p.items():
        assert torch.allclose(g, grads_u[name], atol=1e-5, rtol=0), name
    assert grads_p["vision.blocks.0.attn.qkv.weight"].abs().sum() > 0  # the tower learns from the answers


def test_qwen_tower_rows_carry_their_grids(tmp_path):
    qwen = ('model.vision={arch: qwen2_5_vl_vision, d_model: 32, n_layers: 2, n_heads: 2, ffn_dim: 64, patch_size: 4, '
            'window_size: 16, full_attention_layers: [1], min_pixels: 256, max_pixels: 4096}')
    resolved, data = build(tmp_path, qwen, "model.projector={kind: mlp}")
    batch = ImageChatRows.collate([data.train[r] for r in range(4)])
    grid = batch["image_grid"]
    assert grid.tolist() == [[1, 8, 8]] * len(grid)  # 32 pixels a side in 4-pixel patches: 16 tokens an image
    assert len(batch["images"]) == 64 * len(grid) and (batch["tokens"] == 3).sum() == 16 * len(grid)
    torch.manual_seed(0)
    out = data.loss_fn(resolved.spec.build(resolved.model), batch)
    assert torch.isfinite(out.loss_sum) and out.count > 0


def test_multimodal_rope_trains_packed_rows_as_one_sample_per_row(tmp_path):
    """With Qwen's tower and multimodal RoPE, each packed sample's image positions restart with it."""
    qwen = ('model.vision={arch: qwen2_5_vl_vision, d_model: 32, n_layers: 2, n_heads: 2, ffn_dim: 64, patch_size: 4, '
            'window_size: 16, full_attention_layers: [1], min_pixels: 256, max_pixels: 4096}')
    shutil.copytree(FIXTURE / "images", tmp_path / "images")
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join((FIXTURE / "shapes.jsonl").read_text().splitlines()[:16]) + "\n")
    mrope = (qwen, "model.projector={kind: identity}", "model.language.mrope_section=[2, 3, 3]",
             f"data.sources=[{path}]", "data.valid_fraction=0")
    resolved, packed = build(tmp_path, *mrope)
    _, padded = build(tmp_path, *mrope, "data.packing=false")
    assert len(packed.train) < len(padded.train)
    torch.manual_seed(0)
    model = resolved.spec.build(resolved.model).train()
    loss_p, grads_p = loss_and_grads(model, packed)
    loss_u, grads_u = loss_and_grads(model, padded)
    assert torch.allclose(loss_p, loss_u, atol=1e-5, rtol=0)
    for name, g in grads_p.items():
        assert torch.allclose(g, grads_u[name], atol=1e-5, rtol=0), name


def test_truncation_drops_a_sample_rather_than_cut_an_image(tmp_path):
    shutil.copytree(FIXTURE / "images", tmp_path / "images")
    images = (FIXTURE / "shapes.jsonl").read_text().splitlines()[:10]
    text = [json.dumps({"messages": [{"role": "user", "content": "red"},
                                     {"role": "assistant", "content": " ".join(["red blue"] * 12)}]})] * 10
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(images + text) + "\n")
    # 20 tokens end inside every image (its 16 tokens follow the 6 of "<|im_start|>user\n"), and inside every long
    # answer (its prompt is 19 tokens).
    _, data = build(tmp_path, f"data.sources=[{path}]", "data.truncation=truncate", "data.seq_len=20",
                    "data.valid_fraction=0", "data.packing=false")
    assert data.summary["dropped (truncation through an image)"] == 10 and data.summary["truncated"] == 10
    assert data.summary["train_samples"] == 10
    assert all(len(data.train[r]["images"]) == 0 for r in range(len(data.train)))


def test_malformed_image_rows_fail_past_the_limit(tmp_path):
    shutil.copytree(FIXTURE / "images", tmp_path / "images")
    lines = (FIXTURE / "shapes.jsonl").read_text().splitlines()[:20]
    bad = json.loads(lines[1])
    bad["images"] = ["images/missing.png"]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join([*lines[:4], json.dumps(bad), *lines[4:]]) + "\n")
    with pytest.raises(ChatDataError, match=r"1 of 21 rows are malformed.*missing image × 1 \(rows 5\)"):
        build(tmp_path, f"data.sources=[{path}]")
    _, data = build(tmp_path, f"data.sources=[{path}]", "data.max_malformed_fraction=0.1", "data.valid_fraction=0")
    assert data.summary["train_samples"] == 20


def test_the_placeholder_must_be_the_models_image_token(tmp_path):
    with pytest.raises(ConfigError, match=r"data.image_token: '<image>' is not the single token "
                                          r"model.image_token_id=4"):
        build(tmp_path, "model.image_token_id=4")
    with pytest.raises(ConfigError, match=r"data.image_token: '<img>'"):
        build(tmp_path, "data.image_token=<img>")


@pytest.mark.slow
def test_a_frozen_tower_stays_bitwise_unchanged(tmp_path, monkeypatch):
    from tests.trainer.test_param_rules import trained

    resolved = resolve(tmp_path, "train.steps=3", "train.eval_every=0", "checkpoint.export=false",
                       "train.optimizer.weight_decay=0.1", 'train.param_groups=[{match: "vision.*", lr_scale: 0}]')
    start, end, lr = trained(monkeypatch, resolved)
    for name, before in start.items():
        if name.startswith("vision."):
            assert torch.equal(before, end[name]) and name not in lr, name
        else:
            assert not torch.equal(before, end[name]), name


@pytest.mark.slow
def test_tiny_config_trains_through_the_command_line(tmp_path):
    proc = run_longboat("train", str(CONFIG), f"run_dir={tmp_path / 'run'}", *SMALL, "train.steps=4",
                        "train.log_every=2", "train.eval_every=4", "train.num_workers=1", check=True)
    assert "step 4 · valid loss" in proc.stdout and "exported to" in proc.stdout, proc.stdout
    assert (tmp_path / "run" / "export").is_dir()
