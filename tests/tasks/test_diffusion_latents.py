"""The diffusion task on a latent cache: items are keyed draws of the stored posterior, scaled; the latents fill the
model's shape; DiT-tiny trains a few steps on latents of a tiny AutoencoderKL; ``longboat sample`` decodes with the
same VAE; a mismatched model or cache ends in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from longboat.cli.main import main
from longboat.data.latent_cache import LatentSourceConfig, encode_source, open_latents
from longboat.models.generative.keyed_random import keyed_normal, noise_key
from longboat.recipes import train
from longboat.recipes.config import resolve
from longboat.recipes.latent_vae import latent_encoder
from longboat.recipes.sample import sample
from longboat.tasks.diffusion import SPEC_FILE
from longboat.tasks.diffusion_latents import POSTERIOR_STREAM, LatentSamples
from tests.data.test_latent_cache import write_folder, write_vae


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("latents")
    vae = write_vae(root / "vae")
    source = write_folder(root / "images", per_class=8)
    path, _ = encode_source(LatentSourceConfig(source=str(source), size=16), latent_encoder(str(vae)), root / "cache")
    return path


def config(tmp_path: Path, cache: Path, steps: int = 3, **model) -> dict:
    return {"task": "diffusion", "run_dir": str(tmp_path / "run"), "seed": 3,
            "model": {"arch": "dit", "preset": "tiny", "hidden_size": 32, "depth": 2, "num_heads": 2,
                      "in_channels": None, "num_classes": None, **model},
            "data": {"latents": str(cache), "valid_fraction": 0.5},
            "train": {"steps": steps, "micro_batch_size": 8, "num_workers": 0, "log_every": 1, "eval_batches": 1,
                      "tensorboard": False, "optimizer": {"lr": 3e-3}, "schedule": {"kind": "constant"}},
            "checkpoint": {"every": 0}}


def test_items_are_keyed_draws_of_the_posterior_scaled(cache):
    latents = open_latents(cache)
    samples = LatentSamples(latents, seed=7)
    item = samples[(3, 11)]
    noise = keyed_normal(torch.tensor([noise_key(7, 11)]), tuple(latents.mean.shape[1:]), POSTERIOR_STREAM)[0]
    z = latents.mean[3] + torch.exp(0.5 * latents.logvar[3]) * noise
    torch.testing.assert_close(item["image"], (z - 0.1) * 0.5)
    assert torch.equal(samples[(3, 11)]["image"], item["image"])
    assert not torch.equal(samples[(3, 12)]["image"], item["image"])  # another position, another draw
    assert item["label"] == latents.labels[3] and item["noise_key"] == noise_key(7, 11)


def test_dit_trains_on_cached_latents_and_samples_decode_with_the_vae(tmp_path, cache):
    resolved = resolve(config(tmp_path, cache))
    assert (resolved.model.in_channels, resolved.model.image_size, resolved.model.num_classes) == (4, 8, 2)
    result = train.run(resolved)
    assert result.valid_loss is not None and torch.isfinite(torch.tensor(result.valid_loss))
    spec = json.loads((tmp_path / "run" / "export" / SPEC_FILE).read_text())
    assert spec["channels"] == 4 and spec["latents"] == str(cache) and Path(spec["vae"]).name == "vae"
    sample(tmp_path / "run", tmp_path / "samples", classes=[1], num=2, steps=2)
    image = Image.open(tmp_path / "samples" / "grid.png")
    png = Image.open(next((tmp_path / "samples").glob("00000_*.png")))
    assert png.size == (16, 16) and png.mode == "RGB" and image.mode == "RGB"  # decoded to the VAE's pixels


@pytest.mark.parametrize("override, message", [
    ("model.in_channels=3", "model.in_channels=3 disagrees with the data"),
    ("data.source=digits", "set one of data.source (pixels) and data.latents"),
    ("data.latents={tmp}", "data.latents: {tmp}: no index.json"),
])
def test_a_mismatched_model_or_cache_ends_in_one_line(tmp_path, cache, capsys, override, message):
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(config(tmp_path, cache)))
    code = main(["train", str(path), override.format(tmp=tmp_path), "--check"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message.format(tmp=tmp_path) in err, err


def test_clip_latents_are_refused_in_one_line(tmp_path):
    from longboat.config.base import ConfigError
    from longboat.tasks.diffusion_latents import open_latent_split
    from tests.data.test_video_sources import metadata_csv, mp4

    mp4(tmp_path / "a.mp4")
    cfg = LatentSourceConfig(source=str(metadata_csv(tmp_path, [("a.mp4", "grey")])), size=16, frames=5, fps=10)
    path, _ = encode_source(cfg, latent_encoder("wan_vae:tiny"), tmp_path / "cache")
    with pytest.raises(ConfigError, match=r"latents of shape \[4, 2, 4, 4\]; the diffusion task trains on square"):
        open_latent_split(str(path), 0.0, 0)
