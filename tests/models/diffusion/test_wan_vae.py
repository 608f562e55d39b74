import pytest
import torch

from longboat.models import build_model, get_model
from longboat.models.diffusion import WanVAE, WanVAEConfig


def tiny(**over) -> WanVAE:
    torch.manual_seed(0)
    return WanVAE(WanVAEConfig(**{**get_model("wan_vae").load_preset("tiny"), **over}))


def test_shapes_and_gradients_through_the_streamed_chunks():
    model = tiny(latents_mean=(0.1, 0.2, 0.3, 0.4), latents_std=(1.0, 2.0, 3.0, 4.0))
    assert (model.cfg.temporal_factor, model.cfg.spatial_factor) == (4, 4)
    x = torch.randn(2, 3, 9, 16, 12)
    posterior = model.encode(x)
    assert posterior.mean.shape == posterior.logvar.shape == (2, 4, 3, 4, 3)
    assert posterior.kl().shape == (2,)
    noise = torch.randn(2, 4, 3, 4, 3)
    out = model(x, noise)
    assert out.shape == x.shape and out.abs().max() <= 1.0
    (out.square().mean() + posterior.kl().mean()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    z = posterior.mean.detach()
    scaled = model.scale_latents(z)
    torch.testing.assert_close(scaled[:, 3], (z[:, 3] - 0.4) / 4.0)
    torch.testing.assert_close(model.unscale_latents(scaled), z)


def test_encode_and_decode_are_causal_in_time():
    model = tiny(temporal_downsample=(False, True)).eval()  # frames /2: chunks of 4 give 2 latent frames each
    x = torch.randn(1, 3, 9, 8, 8)
    later = x.clone()
    later[:, :, 5:] += 1.0
    with torch.no_grad():
        a, b = model.encode(x).mean, model.encode(later).mean
        assert a.shape[2] == 5
        torch.testing.assert_close(a[:, :, :3], b[:, :, :3])  # latent frames 0-2 see input frames 0-4 only
        assert (a[:, :, 3:] - b[:, :, 3:]).abs().max() > 1e-3
        z = torch.randn(1, 4, 3, 2, 2)
        z2 = z.clone()
        z2[:, :, 2] += 1.0
        x1, x2 = model.decode(z), model.decode(z2)
        assert x1.shape == (1, 3, 5, 8, 8)
        torch.testing.assert_close(x1[:, :, :3], x2[:, :, :3])  # frame 0, then 2 per later latent frame
        assert (x1[:, :, 3:] - x2[:, :, 3:]).abs().max() > 1e-4


def test_a_first_frame_encodes_as_an_image_whatever_follows():
    model = tiny().eval()
    x = torch.randn(1, 3, 5, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model.encode(x[:, :, :1]).mean[:, :, 0], model.encode(x).mean[:, :, 0])
        z = torch.randn(1, 4, 2, 2, 2)
        torch.testing.assert_close(model.decode(z[:, :, :1])[:, :, 0], model.decode(z)[:, :, 0])


def test_bad_shapes_and_configs_are_refused():
    model = tiny()
    with pytest.raises(ValueError, match=r"1 \+ 4k frames, H, W\]; got \[1, 3, 4, 8, 8\]"):
        model.encode(torch.randn(1, 3, 4, 8, 8))
    with pytest.raises(ValueError, match=r"decodes latents \[B, 4, T, h, w\]; got \[1, 4, 2, 2\]"):
        model.decode(torch.randn(1, 4, 2, 2))
    with pytest.raises(ValueError, match="temporal_downsample has 1 entries; it needs one per stage but the last"):
        WanVAEConfig(temporal_downsample=(True,))
    with pytest.raises(ValueError, match="latents_std has 16 entries; z_dim is 4"):
        WanVAEConfig(z_dim=4, latents_mean=(0.0,) * 4)
    with pytest.raises(ValueError, match="at most twice"):
        WanVAEConfig(dim_mult=(1, 1, 1, 1), temporal_downsample=(True, True, True))


def test_registered_with_presets_and_the_default_is_wan_2_1():
    spec = get_model("wan_vae")
    assert spec.preset_names() == ["tiny", "wan2.1"]
    assert WanVAEConfig(**spec.load_preset("wan2.1")) == WanVAEConfig()
    dit = get_model("dit")  # the same package's presets/ folder, without the wan_vae subfolder
    assert "wan_vae" not in dit.preset_names() and dit.load_preset("tiny") != spec.load_preset("tiny")
    model = build_model("wan_vae", spec.load_preset("tiny"))
    assert isinstance(model, WanVAE) and sum(p.numel() for p in model.parameters()) < 200_000
    with torch.device("meta"):
        full = WanVAE(WanVAEConfig())
    assert sum(p.numel() for p in full.parameters()) == 126_892_531


def test_bfloat16_runs_and_stays_near_float32():
    model = tiny().eval()
    x = torch.randn(1, 3, 5, 8, 8)
    with torch.no_grad():
        want = model.encode(x).mean
        got = model.to(torch.bfloat16).encode(x.bfloat16()).mean
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() < 0.1 * want.abs().max()
