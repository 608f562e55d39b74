import pytest
import torch
from diffusers import AutoencoderKL as DiffusersAutoencoderKL

from longboat.cli.main import main
from longboat.models import get_model, hf_spec
from longboat.models.diffusion.vae import AutoencoderKL, VAEConfig
from longboat.models.diffusion.vae_diffusers import (
    config_from_diffusers,
    config_to_diffusers,
    state_dict_from_diffusers,
    state_dict_to_diffusers,
)
from longboat.models.llm.hf.adapter import HFConversionError

SD_LIKE = dict(block_out_channels=(32, 64), layers_per_block=1, latent_channels=4, norm_num_groups=8,
               down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2)
FLUX_LIKE = dict(block_out_channels=(16, 32, 32), layers_per_block=1, latent_channels=8, norm_num_groups=8,
                 down_block_types=["DownEncoderBlock2D"] * 3, up_block_types=["UpDecoderBlock2D"] * 3,
                 use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=False,
                 scaling_factor=0.3611, shift_factor=0.1159)


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights everywhere, norms' scales around one, so a misplaced norm or bias shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = "norm" in name and name.endswith("weight")
            p.copy_(torch.randn(p.shape, generator=g) * 0.05 + (1.0 if scale else 0.0))


def assert_same_outputs(ours: AutoencoderKL, theirs: DiffusersAutoencoderKL) -> None:
    g = torch.Generator().manual_seed(1)
    f = ours.cfg.downsample_factor
    x = torch.randn(2, 3, 32, 32, generator=g)
    z = torch.randn(2, ours.cfg.latent_channels, 32 // f, 32 // f, generator=g)
    with torch.no_grad():
        want = theirs.encode(x).latent_dist
        got = ours.encode(x)
        assert want.mean.shape == got.mean.shape == z.shape and want.mean.abs().mean() > 0.05
        torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=1e-4)
        torch.testing.assert_close(got.logvar, want.logvar, rtol=0, atol=1e-4)
        image = theirs.decode(z).sample
        assert image.shape == x.shape and image.abs().mean() > 0.05
        torch.testing.assert_close(ours.decode(z), image, rtol=0, atol=1e-4)


@pytest.mark.parametrize("options", [SD_LIKE, FLUX_LIKE], ids=["sd", "flux"])
def test_diffusers_to_ours(options):
    theirs = DiffusersAutoencoderKL(**options).eval()
    randomize(theirs)
    cfg = VAEConfig(**config_from_diffusers(dict(theirs.config)))
    assert cfg.shift_factor == options.get("shift_factor") and cfg.use_quant_conv == options.get("use_quant_conv", 1)
    ours = AutoencoderKL(cfg).eval()
    ours.load_state_dict(state_dict_from_diffusers(theirs.state_dict(), cfg))
    assert_same_outputs(ours, theirs)


def test_ours_to_diffusers_and_back():
    cfg = VAEConfig(in_channels=3, out_channels=3, block_out_channels=(16, 32), layers_per_block=2,
                    latent_channels=4, norm_num_groups=4, scaling_factor=0.13025)
    ours = AutoencoderKL(cfg).eval()
    randomize(ours, seed=2)
    config = {k: v for k, v in config_to_diffusers(cfg).items() if not k.startswith("_")}
    theirs = DiffusersAutoencoderKL(**config).eval()
    theirs.load_state_dict(state_dict_to_diffusers(ours.state_dict(), cfg), strict=True)
    assert_same_outputs(ours, theirs)
    assert VAEConfig(**config_from_diffusers(dict(theirs.config))) == cfg
    back = state_dict_from_diffusers(theirs.state_dict(), cfg)
    assert back.keys() == ours.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in ours.state_dict().items())


def test_legacy_attention_names_are_read():
    theirs = DiffusersAutoencoderKL(**SD_LIKE).eval()
    randomize(theirs)
    old = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
    state = {}
    for name, tensor in theirs.state_dict().items():
        for new, legacy in old.items():
            name = name.replace(f"attentions.0.{new}.", f"attentions.0.{legacy}.")
        state[name] = tensor
    assert any(".query." in name for name in state)
    cfg = VAEConfig(**config_from_diffusers(dict(theirs.config)))
    ours = AutoencoderKL(cfg).eval()
    ours.load_state_dict(state_dict_from_diffusers(state, cfg), strict=True)
    assert_same_outputs(ours, theirs)


def test_what_cannot_be_represented_is_named():
    config = dict(DiffusersAutoencoderKL(**SD_LIKE).config)
    with pytest.raises(HFConversionError, match="act_fn='gelu' is not supported"):
        config_from_diffusers({**config, "act_fn": "gelu"})
    with pytest.raises(HFConversionError, match="latents_mean=.* is not supported"):
        config_from_diffusers({**config, "latents_mean": [0.0] * 4})
    with pytest.raises(HFConversionError, match="down_block_types=.*AttnDownEncoderBlock2D.* is not supported"):
        config_from_diffusers({**config, "down_block_types": ["DownEncoderBlock2D", "AttnDownEncoderBlock2D"]})
    with pytest.raises(HFConversionError, match="up_block_types=.* for each of the 2 block_out_channels"):
        config_from_diffusers({**config, "up_block_types": ["UpDecoderBlock2D"]})
    with pytest.raises(HFConversionError, match="option 'norm_type' is not one"):
        config_from_diffusers({**config, "norm_type": "spatial"})
    cfg = VAEConfig(**config_from_diffusers(config))
    assert VAEConfig(**config_from_diffusers({**config, "act_fn": "swish"})) == cfg  # diffusers' alias of SiLU
    with pytest.raises(HFConversionError, match="weight encoder.extra.weight has no counterpart"):
        state_dict_from_diffusers({"encoder.extra.weight": torch.zeros(1)}, cfg)


def test_directories_and_the_convert_command(tmp_path):
    theirs = DiffusersAutoencoderKL(**FLUX_LIKE).eval()
    randomize(theirs)
    theirs.save_pretrained(tmp_path / "theirs")
    assert hf_spec(tmp_path / "theirs").name == "autoencoder_kl"
    ours, cfg, family, _ = get_model("autoencoder_kl").hf.load(tmp_path / "theirs")
    assert family == "AutoencoderKL" and cfg.shift_factor == 0.1159
    assert_same_outputs(ours, theirs)
    assert main(["convert", "diffusers-to-longboat", str(tmp_path / "theirs"), str(tmp_path / "export")]) == 0
    assert main(["convert", "longboat-to-diffusers", str(tmp_path / "export"), str(tmp_path / "again")]) == 0
    again = DiffusersAutoencoderKL.from_pretrained(tmp_path / "again").eval()
    assert again.config.scaling_factor == 0.3611 and again.config.shift_factor == 0.1159
    assert_same_outputs(ours, again)
