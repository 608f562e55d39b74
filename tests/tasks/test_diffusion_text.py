"""The diffusion task conditioned on captions: the encoder fills the model's text width, dropped captions become the
empty caption's embedding, Wan and DiT train on captioned images, a resumed run equals a straight one bitwise, and
bad input ends in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longboat.cli.main import main
from longboat.models.generative.keyed_random import keyed_uniform
from longboat.recipes import train
from longboat.recipes.config import resolve
from longboat.tasks.diffusion import _DROP, SPEC_FILE
from tests.tasks.test_text_encoder import encoder_config

WAN = {"arch": "wan", "patch_size": [1, 4, 4], "hidden_size": 48, "num_heads": 2, "depth": 2, "ffn_dim": 96,
       "freq_dim": 32}
pytestmark = pytest.mark.usefixtures("one_thread")
DIT = {"arch": "dit", "patch_size": 4, "hidden_size": 32, "depth": 2, "num_heads": 2, "num_classes": 0,
       "frequency_embedding_size": 32}


def config(tmp_path: Path, steps: int = 3, model: dict | None = None, **data) -> dict:
    return {"task": "diffusion", "run_dir": str(tmp_path / "run"), "seed": 3, "model": model or WAN,
            "data": {"source": "shapes", "image_size": 16, "channels": 3, "valid_fraction": 0.05,
                     "text_encoder": encoder_config(cache_dir=str(tmp_path / "cache")), **data},
            "train": {"steps": steps, "micro_batch_size": 8, "num_workers": 0, "log_every": 1, "eval_batches": 1,
                      "tensorboard": False, "optimizer": {"lr": 3e-3}, "schedule": {"kind": "constant"}},
            "checkpoint": {"every": 0}}


def batch_of(dataset, positions):
    items = [dataset[(p % len(dataset), p)] for p in positions]
    return {k: torch.stack([item[k] for item in items]) for k in items[0]}


def test_dropped_captions_become_the_empty_captions_embedding(tmp_path):
    seen = []

    class Spy(torch.nn.Module):
        def forward(self, x, t, text, mask):
            seen.append((text.clone(), mask.clone()))
            return torch.zeros_like(x)

    resolved = resolve(config(tmp_path, cond_dropout=0.5, eval_buckets=0))
    assert resolved.model.text_dim == 32  # the encoder's hidden size
    data = resolved.task.build(resolved.model, resolved.cfg.train, resolved.cfg.seed, 1)
    table = data.train.table
    batch = batch_of(data.train, range(32))
    data.loss_fn(Spy(), batch)
    (text, mask), = seen
    dropped = keyed_uniform(batch["noise_key"], (1,), _DROP, torch.float64)[:, 0] < 0.5
    assert 8 < int(dropped.sum()) < 24
    null, null_mask = table.null
    for i in range(32):
        want = (null, null_mask) if dropped[i] else (batch["text"][i], batch["text_mask"][i])
        assert torch.equal(text[i], want[0]) and torch.equal(mask[i], want[1])
    caption = data.train.samples.images.captions[5]  # each image carries its own caption's embedding
    assert torch.equal(batch["text"][5], table.embeddings[table.row[caption]])


@pytest.mark.parametrize("model", [WAN, DIT], ids=["wan", "dit"])
def test_wan_and_dit_train_on_captions_and_export_their_encoder(tmp_path, model):
    cfg = config(tmp_path, steps=3, model=model)
    result = train.run(resolve(cfg))
    assert result.step == 3 and torch.isfinite(torch.tensor(result.train_loss))
    spec = json.loads((Path(cfg["run_dir"]) / "export" / SPEC_FILE).read_text())
    assert spec["conditioning"] == "text" and spec["text_dim"] == 32
    assert spec["text_encoder"]["arch"] == "decoder" and len(spec["text_encoder_fingerprint"]) == 64
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_a_resumed_run_equals_a_straight_one_bitwise(tmp_path):
    straight = config(tmp_path / "a", steps=4, cond_dropout=0.3)
    train.run(resolve(straight))
    interrupted = config(tmp_path / "b", steps=2, cond_dropout=0.3)
    train.run(resolve(interrupted))
    interrupted["train"]["steps"] = 4
    train.run(resolve(interrupted))
    a = load_file(Path(straight["run_dir"]) / "export" / "model.safetensors")
    b = load_file(Path(interrupted["run_dir"]) / "export" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("override, message", [
    ("data.source=digits", "data.source: digits has no captions (column 'caption', data.caption_key); "
                           "data.text_encoder needs one per image"),
    ("model.text_dim=48", "model.text_dim=48 disagrees with the data (shapes and data.text_encoder has 32)"),
    ("data.text_encoder=null", "model: WanConfig is conditioned on text (text_dim=4096); set data.text_encoder"),
    ("data.text_encoder.layer=9", "data.text_encoder.layer=9: the encoder has 2 blocks"),
])
def test_bad_input_fails_in_one_line(tmp_path, capsys, override, message):
    path = tmp_path / "diffusion.yaml"
    path.write_text(json.dumps(config(tmp_path)))
    code = main(["train", str(path), override, "--check"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process_and_share_one_cache(tmp_path):
    from longboat.trainer.metrics import read_metrics
    from tests.distributed.conftest import train_on_two_ranks

    single = config(tmp_path / "one", steps=3, cond_dropout=0.3)
    train.run(resolve(single))
    double = config(tmp_path / "two", steps=3, cond_dropout=0.3)
    double["train"].update(micro_batch_size=4, threads=1)
    double["parallel"] = {"data_parallel": "ddp"}
    two = train_on_two_ranks(double, tmp_path)
    for key in ("loss", "mse"):
        ours = [r[key] for r in read_metrics(two) if key in r]
        theirs = [r[key] for r in read_metrics(Path(single["run_dir"])) if key in r]
        assert len(ours) == 3
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-4, atol=1e-5, msg=key)
    # Both ranks encoded into the same place at once: one finished cache folder remains, no partial one.
    assert [p.name.startswith("text-") for p in (tmp_path / "two" / "cache").iterdir()] == [True]
