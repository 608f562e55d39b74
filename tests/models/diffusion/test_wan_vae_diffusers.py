import json

import pytest
import torch
from diffusers import AutoencoderKLWan

from longboat.cli.main import main
from longboat.models import get_model, hf_spec
from longboat.models.diffusion.wan_vae import WanVAE, WanVAEConfig
from longboat.models.diffusion.wan_vae_diffusers import (
    config_from_diffusers,
    config_to_diffusers,
    state_dict_from_diffusers,
    state_dict_to_diffusers,
)
from longboat.models.llm.hf.adapter import HFConversionError

TINY = dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1, temperal_downsample=[True, True],
            latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 1.0, 2.0, 0.5])
# Wan 2.1's own layout shrunk: a spatial-only first stage, a wider decoder.
WAN21_LIKE = dict(base_dim=8, decoder_base_dim=12, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                  temperal_downsample=[False, True, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights everywhere, RMS-norm scales around one, so a misplaced norm, bias or cached frame shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = name.endswith(("gamma", "norm1.weight", "norm2.weight", "norm_out.weight", "norm.weight"))
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if scale else 0.0))


def assert_same_outputs(ours: WanVAE, theirs: AutoencoderKLWan, frames=(1, 5, 9)) -> None:
    g = torch.Generator().manual_seed(1)
    s, t = ours.cfg.spatial_factor, ours.cfg.temporal_factor
    for n in frames:
        x = torch.randn(1, 3, n, 16, 16, generator=g)
        z = torch.randn(1, ours.cfg.z_dim, 1 + (n - 1) // t, 16 // s, 16 // s, generator=g)
        with torch.no_grad():
            want = theirs.encode(x).latent_dist
            got = ours.encode(x)
            assert want.mean.shape == got.mean.shape == z.shape and want.mean.abs().mean() > 0.05
            torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=1e-4)
            torch.testing.assert_close(got.logvar, want.logvar, rtol=0, atol=1e-4)
            video = theirs.decode(z).sample
            assert video.shape == x.shape and video.abs().mean() > 0.05 and (video.abs() < 1).float().mean() > 0.5
            torch.testing.assert_close(ours.decode(z), video, rtol=0, atol=1e-4)


@pytest.mark.parametrize("options", [TINY, WAN21_LIKE], ids=["tiny", "wan21-like"])
def test_diffusers_to_ours(options):
    theirs = AutoencoderKLWan(**options).eval()
    randomize(theirs)
    cfg = WanVAEConfig(**config_from_diffusers(dict(theirs.config)))
    assert cfg.decoder_base_dim == options.get("decoder_base_dim") and cfg.latents_std == tuple(options["latents_std"])
    ours = WanVAE(cfg).eval()
    ours.load_state_dict(state_dict_from_diffusers(theirs.state_dict(), cfg), strict=True)
    assert_same_outputs(ours, theirs, frames=(1, 5, 9) if options is TINY else (5,))


def test_ours_to_diffusers_and_back():
    cfg = WanVAEConfig(**{**get_model("wan_vae").load_preset("tiny"), "in_channels": 3, "num_res_blocks": 2})
    ours = WanVAE(cfg).eval()
    randomize(ours, seed=2)
    config = {k: v for k, v in config_to_diffusers(cfg).items() if not k.startswith("_")}
    theirs = AutoencoderKLWan(**config).eval()
    theirs.load_state_dict(state_dict_to_diffusers(ours.state_dict(), cfg), strict=True)
    assert_same_outputs(ours, theirs, frames=(5,))
    assert WanVAEConfig(**config_from_diffusers(dict(theirs.config))) == cfg
    back = state_dict_from_diffusers(theirs.state_dict(), cfg)
    assert back.keys() == ours.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in ours.state_dict().items())


def test_the_default_config_counts_what_diffusers_counts():
    with torch.device("meta"):
        theirs = AutoencoderKLWan()
        ours = WanVAE(WanVAEConfig(**config_from_diffusers(dict(theirs.config))))
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters()) == 126_892_531
    assert ours.cfg == WanVAEConfig()
    names = state_dict_to_diffusers(ours.state_dict(), ours.cfg)
    assert {k: tuple(v.shape) for k, v in names.items()} == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}


def test_what_cannot_be_represented_is_named():
    config = dict(AutoencoderKLWan(**TINY).config)
    for key, value, says in (("is_residual", True, "is_residual=True is not supported"),
                             ("patch_size", 2, "patch_size=2 is not supported"),
                             ("attn_scales", [0.5], r"attn_scales=\[0.5\] is not supported"),
                             ("dropout", 0.1, "dropout=0.1 is not supported"),
                             ("clip_output", False, "option 'clip_output' is not one longboat's Wan VAE represents")):
        with pytest.raises(HFConversionError, match=says) as err:
            config_from_diffusers({**config, key: value})
        assert "\n" not in str(err.value)
    cfg = WanVAEConfig(**config_from_diffusers(config))
    with pytest.raises(HFConversionError, match="weight encoder.extra.weight has no counterpart"):
        state_dict_from_diffusers({"encoder.extra.weight": torch.zeros(1)}, cfg)


def test_directories_and_the_convert_command(tmp_path, capsys):
    theirs = AutoencoderKLWan(**WAN21_LIKE).eval()
    randomize(theirs, seed=3)
    theirs.save_pretrained(tmp_path / "theirs")
    assert hf_spec(tmp_path / "theirs").name == "wan_vae"
    ours, cfg, family, _ = get_model("wan_vae").hf.load(tmp_path / "theirs")
    assert family == "AutoencoderKLWan" and cfg.decoder_base_dim == 12
    assert_same_outputs(ours, theirs, frames=(5,))
    assert main(["convert", "diffusers-to-longboat", str(tmp_path / "theirs"), str(tmp_path / "export")]) == 0
    assert main(["convert", "longboat-to-diffusers", str(tmp_path / "export"), str(tmp_path / "again")]) == 0
    again = AutoencoderKLWan.from_pretrained(tmp_path / "again").eval()
    assert again.config.decoder_base_dim == 12 and again.config.scale_factor_spatial == 8
    assert_same_outputs(ours, again, frames=(5,))
    bad = dict(theirs.config, is_residual=True)
    (tmp_path / "theirs" / "config.json").write_text(json.dumps(bad))
    assert main(["convert", "diffusers-to-longboat", str(tmp_path / "theirs"), str(tmp_path / "x")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is_residual=True is not supported" in err[0]
