"""Latent caches: an unchanged source is found and never encoded again; a changed image, VAE weight or size makes a
new cache; a damaged shard is never read; the latents are the VAE's own encoding of the same pixels; clips encode
through the video VAE; bad input ends in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from longboat.checkpoint.export import save_export
from longboat.cli.main import main
from longboat.data.image_sources import ImageSourceConfig, open_images
from longboat.data.latent_cache import (LatentCacheError, LatentSourceConfig, channel_affine, encode_source,
                                        open_latents)
from longboat.models.diffusion import AutoencoderKL, VAEConfig
from longboat.recipes.latent_vae import latent_encoder, open_vae

TINY_VAE = VAEConfig(in_channels=3, out_channels=3, block_out_channels=(8, 8), layers_per_block=1, latent_channels=4,
                     norm_num_groups=4, scaling_factor=0.5, shift_factor=0.1)


def write_vae(path: Path, bump: float = 0.0) -> Path:
    """A tiny AutoencoderKL export (seed 0), one weight moved by ``bump``."""
    torch.manual_seed(0)
    model = AutoencoderKL(TINY_VAE)
    model.init_weights()
    model.init_buffers()
    with torch.no_grad():
        model.encoder.conv_in.weight[0, 0, 0, 0] += bump
    return save_export(path, model, "autoencoder_kl", TINY_VAE.model_dump(mode="json"), overwrite=True)


def write_folder(root: Path, per_class: int = 3) -> Path:
    """Two class folders of small RGB images, each a different colour ramp."""
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def vae(tmp_path_factory) -> Path:
    return write_vae(tmp_path_factory.mktemp("vae") / "vae")


class Counting:
    """The encoder of ``vae`` with a count of its calls."""

    def __init__(self, vae: Path):
        self.encoder = latent_encoder(str(vae))
        self.calls, inner = 0, self.encoder.encode

        def encode(pixels):
            self.calls += 1
            return inner(pixels)

        self.encoder.encode = encode


def test_an_unchanged_source_is_found_and_not_encoded_again(tmp_path, vae):
    source = write_folder(tmp_path / "images")
    cfg = LatentSourceConfig(source=str(source), size=8, batch=4)
    counting = Counting(vae)
    path, found = encode_source(cfg, counting.encoder, tmp_path / "cache")
    assert not found and counting.calls == 2  # 6 images, 4 a call
    mtime = path.stat().st_mtime_ns
    again, found = encode_source(cfg, Counting(vae).encoder, tmp_path / "cache")
    fresh = Counting(vae)
    encode_source(cfg, fresh.encoder, tmp_path / "cache")
    assert again == path and found and fresh.calls == 0 and path.stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [path.name]  # no temporary left behind


def test_a_changed_image_vae_weight_or_size_makes_a_new_cache(tmp_path, vae):
    source = write_folder(tmp_path / "images")
    cfg = LatentSourceConfig(source=str(source), size=8, batch=8)
    out = tmp_path / "cache"
    first, _ = encode_source(cfg, latent_encoder(str(vae)), out)
    Image.new("RGB", (12, 12), (1, 2, 3)).save(source / "dog" / "1.png")
    changed_image, found = encode_source(cfg, latent_encoder(str(vae)), out)
    assert not found and changed_image != first
    bumped = write_vae(tmp_path / "vae2", bump=1e-3)
    changed_vae, found = encode_source(cfg, latent_encoder(str(bumped)), out)
    resized, found2 = encode_source(cfg.model_copy(update={"size": 4}), latent_encoder(str(vae)), out)
    assert not found and not found2 and len({first, changed_image, changed_vae, resized}) == 4
    assert open_latents(resized).mean.shape[-1] == 2  # 4 pixels, one downsampling


def test_a_truncated_shard_is_never_read_and_encoding_rebuilds_it(tmp_path, vae):
    cfg = LatentSourceConfig(source=str(write_folder(tmp_path / "images")), size=8, shard_items=4)
    path, _ = encode_source(cfg, latent_encoder(str(vae)), tmp_path / "cache")
    shard = path / "shard-00001.safetensors"
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(LatentCacheError, match="shard-00001.safetensors: missing, truncated or changed") as err:
        open_latents(path)
    assert "\n" not in str(err.value)
    counting = Counting(vae)
    rebuilt, found = encode_source(cfg, counting.encoder, tmp_path / "cache")
    assert rebuilt == path and not found and counting.calls == 1
    assert shard.read_bytes() == whole and len(open_latents(path)) == 6


def test_latents_are_the_vaes_own_encoding_of_the_same_pixels(tmp_path, vae):
    source = write_folder(tmp_path / "images")
    path, _ = encode_source(LatentSourceConfig(source=str(source), size=8, batch=4, shard_items=5),
                            latent_encoder(str(vae)), tmp_path / "cache")
    latents = open_latents(path)
    pixels = open_images(ImageSourceConfig(source=str(source), image_size=8, channels=3, valid_fraction=0))
    model = open_vae(str(vae))[0]
    with torch.no_grad():
        posterior = model.encode(pixels.images)
        scaled = model.scale_latents(posterior.sample(torch.ones_like(posterior.mean)))
    torch.testing.assert_close(latents.mean, posterior.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(latents.logvar, posterior.logvar, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(latents.draw(2, torch.ones_like(latents.mean[2])), scaled[2], rtol=1e-5, atol=1e-6)
    assert latents.labels.tolist() == pixels.labels.tolist() and latents.classes == ["cat", "dog"]
    assert latents.names == pixels.names and latents.names[0].endswith("cat/0.png")
    index = json.loads((path / "index.json").read_text())
    assert [i["shard"] for i in index["items"]] == [0] * 5 + [1] and index["items"][5]["offset"] == 0
    assert index["scale"] == pytest.approx([0.5] * 4) and index["shift"] == pytest.approx([0.1] * 4)


def test_per_channel_affine_is_read_off_the_scaling():
    mean, std = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 4.0])
    scale, shift = channel_affine(lambda z: (z - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1), 2)
    assert scale == pytest.approx([2.0, 0.25]) and shift == pytest.approx([1.0, -2.0])


def test_clips_encode_through_the_video_vae(tmp_path):
    from tests.data.test_video_sources import metadata_csv, mp4

    mp4(tmp_path / "a.mp4")
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    csv_path = metadata_csv(tmp_path, [("a.mp4", "grey ramp"), ("bad.mp4", "broken")])
    cfg = LatentSourceConfig(source=str(csv_path), size=16, frames=5, fps=10, max_malformed_fraction=0.5)
    path, _ = encode_source(cfg, latent_encoder("wan_vae:tiny"), tmp_path / "cache")
    latents = open_latents(path)
    assert tuple(latents.mean.shape) == (1, 4, 2, 4, 4) and latents.captions == ["grey ramp"]
    assert json.loads((path / "index.json").read_text())["malformed"][0].startswith(str(tmp_path / "bad.mp4"))


def test_a_changed_clip_file_makes_a_new_cache(tmp_path):
    from longboat.data.latent_fingerprint import source_fingerprint

    (tmp_path / "a.mp4").write_bytes(b"one")
    (tmp_path / "rows.jsonl").write_text('{"video": "a.mp4", "caption": "x"}\n')
    keys = {"video_key": "video"}
    before = source_fingerprint(str(tmp_path / "rows.jsonl"), True, keys)
    (tmp_path / "a.mp4").write_bytes(b"two")
    assert source_fingerprint(str(tmp_path / "rows.jsonl"), True, keys) != before


@pytest.mark.parametrize("args, message", [
    (["--vae", "{tmp}/missing"], "--vae {tmp}/missing: no such export"),
    (["--vae", "dit:tiny"], "architecture 'dit' is no VAE"),
    (["--latent-channels", "16"], "makes 4-channel latents, --latent-channels says 16"),
    (["--source", "{tmp}/nothing"], "--source {tmp}/nothing: no such folder or file"),
    (["--source", "{tmp}/notes.txt"], "expected 'digits', a folder of class subfolders"),
    (["--size", "0"], "size"),
    (["--vae", "wan_vae:tiny"], "--vae wan_vae:tiny: WanVAE encodes clips"),
])
def test_bad_input_ends_in_one_line(tmp_path, vae, capsys, args, message):
    (tmp_path / "notes.txt").write_text("hi")
    base = {"--source": str(write_folder(tmp_path / "images", 1)), "--vae": str(vae), "--size": "8"}
    pairs = dict(base, **{args[i]: args[i + 1].format(tmp=tmp_path) for i in range(0, len(args), 2)})
    code = main(["data", "encode", "--output", str(tmp_path / "cache"), *[x for kv in pairs.items() for x in kv]])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message.format(tmp=tmp_path) in err, err


def test_a_directory_that_is_no_cache_is_refused_in_one_line(tmp_path):
    with pytest.raises(LatentCacheError, match="no index.json"):
        open_latents(tmp_path)
    (tmp_path / "index.json").write_text('{"format_version": 99}')
    with pytest.raises(LatentCacheError, match="latent cache format 99"):
        open_latents(tmp_path)


def test_the_command_names_unreadable_inputs_and_finds_its_cache_again(tmp_path, vae, capsys):
    source = write_folder(tmp_path / "images", 2)
    (source / "cat" / "broken.png").write_bytes(b"not an image")
    args = ["data", "encode", "--source", str(source), "--vae", str(vae), "--output", str(tmp_path / "cache"),
            "--size", "8", "--max-malformed-fraction", "0.5"]
    assert not main(args)  # None or 0: success
    first = capsys.readouterr().out
    assert "encoded 4 items; 1 unreadable skipped" in first and "broken.png" in first, first
    assert not main(args)  # None or 0: success
    assert "unchanged, not encoded again; 1 unreadable skipped" in capsys.readouterr().out
