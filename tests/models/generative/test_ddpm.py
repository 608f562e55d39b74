"""The DDPM/DDIM noise schedule: the squared-cosine table, forward noising and the DDIM step against their closed
forms, and DDIM sampling with an oracle network."""

import math

import pytest
import torch

from longboat.models.generative.ddpm import NoiseScheduler, squared_cosine_alphas_cumprod, squared_cosine_betas


def test_cosine_schedule_matches_its_closed_form():
    def f(s):
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

    ab = squared_cosine_alphas_cumprod(100)
    closed = torch.tensor([f((t + 1) / 100) / f(0) for t in range(100)], dtype=torch.float64)
    torch.testing.assert_close(ab[:99], closed[:99], rtol=1e-12, atol=0)
    # The last beta would be 1 (no signal left); it is capped at 0.999.
    torch.testing.assert_close(ab[99], ab[98] * 0.001, rtol=1e-12, atol=0)
    assert torch.all(ab[1:] < ab[:-1])


def test_inference_timesteps_start_at_the_noisy_end():
    s = NoiseScheduler(100)
    assert s.inference_timesteps(10) == [99, 89, 79, 69, 59, 49, 39, 29, 19, 9]
    assert s.inference_timesteps(100) == list(range(99, -1, -1))


@pytest.mark.parametrize("prediction", ["epsilon", "sample", "v"])
@pytest.mark.parametrize("steps", [1, 10, 100])
def test_ddim_with_the_true_noise_walks_the_noising_path_to_x0(prediction, steps):
    s = NoiseScheduler(100, prediction, clip=1.0)
    g = torch.Generator().manual_seed(0)
    x0 = (torch.rand(3, 8, 2, generator=g, dtype=torch.float64) * 2 - 1) * 0.9
    eps = torch.randn(3, 8, 2, generator=g, dtype=torch.float64)
    visited = []

    def oracle(x_t, t):  # the network that knows x0: its output is exact at every x_t
        visited.append((x_t, t))
        a = s.alphas_cumprod[t].reshape(-1, 1, 1)
        return s.target(x0, (x_t - a.sqrt() * x0) / (1 - a).sqrt(), t)

    out = s.sample(oracle, s.add_noise(x0, eps, torch.full((3,), 99)), steps)
    torch.testing.assert_close(out, x0, rtol=0, atol=1e-9)
    assert len(visited) == steps
    for x_t, t in visited:  # eta 0: every intermediate sample is x0 noised by the same noise to its timestep
        torch.testing.assert_close(x_t, s.add_noise(x0, eps, t), rtol=0, atol=1e-9)


def test_clip_bounds_the_denoised_sample():
    s = NoiseScheduler(100, "sample", clip=0.5)
    out = s.sample(lambda x, t: torch.full_like(x, 3.0), torch.randn(2, 4, 1), 5)
    assert torch.all(out == 0.5)


def test_betas_are_one_minus_the_ratio_of_consecutive_alphas_cumprod():
    betas, ab = squared_cosine_betas(50), squared_cosine_alphas_cumprod(50)
    torch.testing.assert_close(ab, torch.cumprod(1 - betas, 0), rtol=0, atol=0)
    torch.testing.assert_close(betas[1:], 1 - ab[1:] / ab[:-1], rtol=1e-12, atol=1e-15)
    assert betas.dtype == torch.float64 and torch.all((betas > 0) & (betas <= 0.999))


def test_add_noise_is_the_closed_form_per_sample():
    s = NoiseScheduler(100)
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(3, 5, 2, generator=g), torch.randn(3, 5, 2, generator=g)
    t = torch.tensor([0, 42, 99])
    out = s.add_noise(x0, eps, t)
    for i in range(3):
        a = s.alphas_cumprod[t[i]].float()
        torch.testing.assert_close(out[i], a.sqrt() * x0[i] + (1 - a).sqrt() * eps[i], rtol=1e-6, atol=1e-6)
    # t = -1 is the clean end.
    torch.testing.assert_close(s.add_noise(x0, eps, torch.full((3,), -1)), x0, rtol=0, atol=0)


@pytest.mark.parametrize("prediction", ["epsilon", "sample"])
def test_ddim_step_is_the_closed_form(prediction):
    s = NoiseScheduler(100, prediction, clip=None)
    g = torch.Generator().manual_seed(1)
    x_t, out = torch.randn(2, 4, 3, generator=g, dtype=torch.float64), torch.randn(2, 4, 3, generator=g,
                                                                                  dtype=torch.float64)
    t, t_prev = 70, 40
    a_t, a_prev = s.alphas_cumprod[t], s.alphas_cumprod[t_prev]
    if prediction == "epsilon":
        eps, x0 = out, (x_t - (1 - a_t).sqrt() * out) / a_t.sqrt()
    else:
        x0, eps = out, (x_t - a_t.sqrt() * out) / (1 - a_t).sqrt()
    expected = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps  # DDIM (Song et al., 2021, eq. 12) with eta 0
    torch.testing.assert_close(s.step(out, t, t_prev, x_t), expected, rtol=1e-12, atol=1e-12)
    # The last step lands on the predicted clean sample.
    torch.testing.assert_close(s.step(out, t, -1, x_t), x0, rtol=1e-12, atol=1e-12)


def test_v_prediction_step_matches_diffusers_ddim():
    from diffusers import DDIMScheduler

    ours = NoiseScheduler(100, "v", clip=None)
    ref = DDIMScheduler(num_train_timesteps=100, beta_schedule="squaredcos_cap_v2", prediction_type="v_prediction",
                        clip_sample=False, set_alpha_to_one=True, timestep_spacing="trailing")
    ref.set_timesteps(10)
    assert [int(t) for t in ref.timesteps] == ours.inference_timesteps(10)
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(2, 3, 4, generator=g, dtype=torch.float64), torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    ref.alphas_cumprod = ref.alphas_cumprod.double()
    expected = ref.step(v, 49, x, eta=0.0).prev_sample
    torch.testing.assert_close(ours.step(v, 49, 39, x), expected, rtol=1e-6, atol=1e-6)


def test_snr_is_alpha_bar_over_its_complement():
    s = NoiseScheduler(50)
    t = torch.tensor([0, 10, 49])
    a = s.alphas_cumprod[t]
    torch.testing.assert_close(s.snr(t), a / (1 - a))
    with pytest.raises(ValueError, match="pass t"):
        NoiseScheduler(50, "v").target(torch.zeros(1, 2), torch.zeros(1, 2))
