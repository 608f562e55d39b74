import pytest
import torch

from longboat.config.base import ConfigError
from longboat.models import build_model, get_model
from longboat.models.diffusion import AutoencoderKL, VAEConfig
from longboat.models.diffusion.vae import DiagonalGaussian

CFG = dict(block_out_channels=(16, 32), layers_per_block=1, latent_channels=4, norm_num_groups=8,
           scaling_factor=0.5, shift_factor=0.25)


def test_shapes_odd_sides_and_gradients():
    model = AutoencoderKL(VAEConfig(**CFG))
    assert model.cfg.downsample_factor == 2
    x = torch.randn(2, 3, 16, 12)
    posterior = model.encode(x)
    assert posterior.mean.shape == posterior.logvar.shape == (2, 4, 8, 6)
    assert model.encode(torch.randn(1, 3, 15, 9)).mean.shape == (1, 4, 7, 4)  # an odd side rounds down
    noise = torch.randn(2, 4, 8, 6)
    out = model(x, noise)
    assert out.shape == x.shape
    (out.square().mean() + posterior.kl().mean()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_posterior_sample_is_keyed_by_the_callers_noise():
    model = AutoencoderKL(VAEConfig(**CFG)).eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        posterior = model.encode(x)
        noise = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(3))
        z = posterior.sample(noise)
        torch.testing.assert_close(z, posterior.mean + posterior.logvar.mul(0.5).exp() * noise)
        torch.testing.assert_close(model(x, noise), model.decode(z))
        torch.testing.assert_close(model(x), model.decode(posterior.mean))
    with pytest.raises(ValueError, match=r"noise \[1, 4, 2, 2\] must have the posterior's shape \[1, 4, 4, 4\]"):
        posterior.sample(torch.randn(1, 4, 2, 2))


def test_logvar_is_clamped_and_kl_is_zero_at_the_prior():
    g = DiagonalGaussian(torch.zeros(2, 1, 2, 2), torch.zeros(2, 1, 2, 2))
    assert torch.equal(g.kl(), torch.zeros(2))
    model = AutoencoderKL(VAEConfig(**CFG)).eval()
    with torch.no_grad():
        model.quant_conv.weight[4:].zero_()  # the log-variance half of the posterior's parameters
        model.quant_conv.bias[4:].fill_(1e3)
        assert torch.equal(model.encode(torch.randn(1, 3, 8, 8)).logvar, torch.full((1, 4, 4, 4), 20.0))


def test_latent_scaling_round_trips():
    model = AutoencoderKL(VAEConfig(**CFG))
    z = torch.randn(2, 4, 3, 3)
    torch.testing.assert_close(model.scale_latents(z), (z - 0.25) * 0.5)
    torch.testing.assert_close(model.unscale_latents(model.scale_latents(z)), z)


def test_registered_and_bad_input_is_one_line():
    spec = get_model("autoencoder_kl")
    assert isinstance(build_model("autoencoder_kl", CFG), AutoencoderKL) and spec.hf.families() == ["AutoencoderKL"]
    with pytest.raises(ConfigError, match=r"multiple of norm_num_groups \(8\); 20 is not") as e:
        build_model("autoencoder_kl", {**CFG, "block_out_channels": (16, 20)})
    assert "\n" not in str(e.value)
    model = AutoencoderKL(VAEConfig(**CFG))
    with pytest.raises(ValueError, match=r"encodes images \[B, 3, H, W\]; got \[1, 4, 8, 8\]"):
        model.encode(torch.randn(1, 4, 8, 8))
    with pytest.raises(ValueError, match=r"decodes latents \[B, 4, h, w\]; got \[1, 3, 8, 8\]"):
        model.decode(torch.randn(1, 3, 8, 8))
