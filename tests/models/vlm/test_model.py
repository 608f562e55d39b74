"""The composed vision-language model: image features land at their placeholders and nowhere else, a batch without
an image is the decoder alone, a tiny model trains, a frozen tower stays bitwise unchanged through the real trainer,
and bad configs fail on one line."""

from __future__ import annotations

import pytest
import torch

from longboat.config.base import ConfigError
from longboat.models import get_model
from longboat.models.llm.model import Decoder
from tests.conftest import run_longboat
from tests.models.vlm.conftest import IMAGE_TOKEN, QWEN, VIT, vlm_config, vlm_fields


def build(*args, **kwargs):
    torch.manual_seed(0)
    return get_model("vlm").build(vlm_config(*args, **kwargs))


def tokens_with_images(B=2, T=24, runs=((0, 2, 4), (1, 9, 4))):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(IMAGE_TOKEN + 1, 64, (B, T), generator=g)
    for row, start, n in runs:
        tokens[row, start:start + n] = IMAGE_TOKEN
    return tokens, torch.tensor([[row, start] for row, start, _ in runs])


@pytest.mark.parametrize("projector, per_image", [({"kind": "mlp"}, 16), ({"kind": "patch_merger"}, 4),
                                                  ({"kind": "pixel_shuffle"}, 4)])
def test_image_token_counts_follow_the_geometry(projector, per_image):
    cfg = vlm_config(projector=projector)
    assert cfg.image_tokens(300, 200) == per_image  # any size is resized to the tower's square
    qwen = vlm_config(QWEN)
    assert qwen.image_tokens(32, 48) == (32 // 4) * (48 // 4) // 4


def test_features_land_at_their_placeholders_only():
    model = build(projector={"kind": "patch_merger"})
    tokens, slots = tokens_with_images()
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    out = model(tokens, images=images, image_slots=slots)
    assert torch.equal(out, model(tokens, images=images))  # slots agree with the reading order
    changed = images.clone()
    changed[1] += 1  # the second image, in row 1 from position 9
    diff = (model(tokens, images=changed, image_slots=slots) - out).abs().amax(-1)
    assert torch.equal(diff[0], torch.zeros(24))
    assert torch.equal(diff[1, :9], torch.zeros(9)) and bool((diff[1, 9:] > 0).all())
    expected = model.language.tok_embeddings(tokens).detach()
    expected[tokens == IMAGE_TOKEN] = model.image_features(images).detach()
    assert torch.allclose(out, model.language(expected), atol=1e-6)


def test_qwen_tower_composes():
    assert vlm_config({k: v for k, v in QWEN.items() if k != "out_dim"}, {"kind": "identity"}).vision.out_dim == 32
    model = build(QWEN)
    grid = torch.tensor([[1, 4, 4], [1, 4, 8]])  # 4 and 8 merged tokens
    tokens, slots = tokens_with_images(runs=((0, 1, 4), (1, 3, 8)))
    pixels = torch.randn(int(grid.prod(1).sum()), model.cfg.vision.patch_dim)
    out = model(tokens, images=pixels, image_slots=slots, image_grid=grid)
    assert out.shape == (2, 24, 64) and torch.isfinite(out).all()


def test_count_mismatch_is_a_clear_error():
    model = build()
    tokens, slots = tokens_with_images(runs=((0, 2, 15),))  # one image is 16 tokens
    with pytest.raises(ValueError, match="15 image tokens but the images give 16"):
        model(tokens, images=torch.zeros(1, 3, 16, 16), image_slots=slots)
    with pytest.raises(ValueError, match="15 image tokens but the batch has no image"):
        model(tokens)
    tokens, _ = tokens_with_images(runs=((0, 2, 16),))
    with pytest.raises(ValueError, match="image_slots do not point"):
        model(tokens, images=torch.zeros(1, 3, 16, 16), image_slots=torch.tensor([[0, 3]]))
    tokens, _ = tokens_with_images(runs=((0, 2, 16), (1, 2, 16)))
    with pytest.raises(ValueError, match="image_slots do not point"):
        model(tokens, images=torch.zeros(2, 3, 16, 16), image_slots=torch.tensor([[0, 2], [0, 2]]))


def test_no_image_is_the_decoder_alone_and_still_reaches_the_tower():
    model = build()
    tokens = torch.randint(IMAGE_TOKEN + 1, 64, (2, 24))
    positions = torch.arange(24).repeat(2, 1)
    segments = torch.ones(2, 24, dtype=torch.long)
    segments[:, 10:] = 2
    positions[:, 10:] -= 10
    alone = Decoder(model.cfg.language)
    alone.load_state_dict(model.language.state_dict())
    out = model(tokens, positions, segments=segments)
    assert torch.equal(out, alone(tokens, positions, segments=segments))
    out.sum().backward()
    for name, p in [*model.vision.named_parameters(), *model.projector.named_parameters()]:
        assert p.grad is not None and not p.grad.any(), name  # every rank computes them, as zeros


def test_text_generation_is_the_decoders():
    from longboat.models.llm.generation import generate

    model = build().eval()
    alone = Decoder(model.cfg.language).eval()
    alone.load_state_dict(model.language.state_dict())
    prompt = torch.randint(IMAGE_TOKEN + 1, 64, (2, 5))
    ours = generate(model, prompt, 6, temperature=0.0)
    assert ours.shape == (2, 11) and torch.equal(ours, generate(alone, prompt, 6, temperature=0.0))


def test_tiny_vlm_trains():
    model = build(projector={"kind": "patch_merger"})
    tokens, slots = tokens_with_images(runs=((0, 2, 4), (1, 9, 4)))
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    labels = torch.roll(tokens, -1, 1)
    labels[tokens == IMAGE_TOKEN] = -100
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(
            model(tokens, images=images, image_slots=slots).flatten(0, 1), labels.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    for prefix in ("vision.", "projector.", "language."):
        assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n.startswith(prefix)), prefix


def test_spec_parts():
    spec = get_model("vlm")
    cfg = vlm_config(n_kv_heads=2)
    model = spec.build(cfg)
    assert {n.split(".")[0] for n, _ in model.named_parameters()} == {"vision", "projector", "language"}
    from longboat.distributed.parallelize import parallel_units

    units = parallel_units(model, spec.parallel_units)
    assert len(units) == cfg.vision.n_layers + cfg.language.n_layers
    plan = spec.tensor_parallel_plan(cfg, 2)
    names = {n for n, _ in model.named_modules()}
    for pattern in plan:
        concrete = pattern.replace("*", "0")
        assert concrete in names, pattern
    assert spec.hooks.model_inputs({"tokens": 1, "images": 2, "image_slots": 3}) == {"images": 2, "image_slots": 3}
    moe = spec.build(vlm_config(moe={"d_model": 32, "n_experts": 4, "top_k": 2, "expert_ffn_dim": 16}))
    moe.train()
    moe(torch.randint(6, 64, (1, 8)))
    assert spec.hooks.aux(moe)["loss"].ndim == 0
    assert cfg.vocab_size == 64 and cfg.max_seq_len == 64
    assert cfg.flops_per_token(32) == cfg.language.flops_per_token(32)
    # mlp projector: one patch a token, 6·params through the tower and projector, attention over 16 patches
    params = sum(p.numel() for m in (model.vision, model.projector) for p in m.parameters())
    assert cfg.flops_per_image_token() == 6 * params + 12 * cfg.vision.n_layers * cfg.vision.d_model * 16


@pytest.mark.parametrize("change, message", [
    ({"projector": {"kind": "patch_merger"}, "vision": QWEN}, "merges its own"),
    ({"projector": {"kind": "pixel_shuffle"}, "vision": QWEN}, "merges its own"),
    ({"projector": {"kind": "pixel_shuffle", "merge_size": 3}}, "must divide the 4 patches"),
    ({"image_token_id": 64}, "image_token_id (64) must be below language.vocab_size (64)"),
    ({"projector": {"kind": "patch_merger", "merge_size": 3}}, "must divide the 4 patches"),
    ({"language": {"arch": "mlp", "preset": "tiny"}}, "language.arch 'mlp' cannot read image features"),
])
def test_bad_configs_name_the_field(change, message):
    from longboat.config.base import validate

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(get_model("vlm").config, {**vlm_fields(), **change}, "run.yaml", prefix="model")


@pytest.mark.slow
def test_a_bad_config_is_one_line_on_the_command_line(corpus, tmp_path):
    tokenizer, prefix = corpus
    fields = vlm_fields(projector={"kind": "patch_merger", "merge_size": 3}, vocab_size=512)
    import json

    proc = run_longboat("train", "configs/pretrain/quickstart.yaml", f"run_dir={tmp_path}",
                        f"data.tokenizer={tokenizer}", f"data.paths=[{prefix}]", "data.seq_len=32",
                        f"model={json.dumps({'arch': 'vlm', **fields})}", "--check")
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "merge_size" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_frozen_tower_stays_bitwise_unchanged_through_the_trainer(corpus, tmp_path, monkeypatch):
    from longboat.recipes.config import load_run_config
    from tests.conftest import REPO
    from tests.trainer.test_param_rules import trained

    tokenizer, prefix = corpus
    model = {"arch": "vlm", **vlm_fields(vocab_size=512)}
    resolved = load_run_config(REPO / "configs" / "pretrain" / "quickstart.yaml", [
        f"run_dir={tmp_path}", f"data.tokenizer={tokenizer}", f"data.paths=[{prefix}]", "data.seq_len=32",
        f"model={model}", "train.steps=3", "train.micro_batch_size=2", "train.dtype=fp32", "train.threads=1",
        "train.tensorboard=false", "train.eval_every=0", "checkpoint.every=0", "checkpoint.export=false",
        "train.schedule.warmup_steps=0", "train.optimizer.weight_decay=0.1",
        'train.param_groups=[{match: "vision.*", lr_scale: 0}]'])
    start, end, lr = trained(monkeypatch, resolved)
    for name, before in start.items():
        if name.startswith("vision."):
            assert torch.equal(before, end[name]) and name not in lr, name
    assert all(not torch.equal(start[n], end[n]) for n in start if n.startswith("language.layers."))
