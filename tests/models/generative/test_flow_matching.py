"""Flow matching: the interpolant and velocity identities, the time distributions and the shift, and the orders of
the Euler and Heun samplers on a linear ODE with a known solution."""

import math

import pytest
import torch

from longboat.models.generative.flow_matching import (beta_time, euler_sample, heun_sample, interpolate,
                                                      logit_normal_time, sample_time, shift_time, time_grid,
                                                      uniform_time, velocity_target)


def pair(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 6, 3, generator=g, dtype=torch.float64), torch.randn(4, 6, 3, generator=g,
                                                                               dtype=torch.float64)


def test_interpolant_is_data_at_zero_and_noise_at_one():
    x0, noise = pair()
    torch.testing.assert_close(interpolate(x0, noise, torch.zeros(4, dtype=torch.float64)), x0, rtol=0, atol=0)
    torch.testing.assert_close(interpolate(x0, noise, torch.ones(4, dtype=torch.float64)), noise, rtol=0, atol=0)
    t = torch.tensor([0.1, 0.4, 0.5, 0.9], dtype=torch.float64)
    torch.testing.assert_close(interpolate(x0, noise, t)[2], 0.5 * (x0[2] + noise[2]))


def test_velocity_target_is_the_time_derivative_of_the_interpolant():
    x0, noise = pair(1)
    torch.testing.assert_close(velocity_target(x0, noise), noise - x0, rtol=0, atol=0)
    t, h = torch.full((4,), 0.3, dtype=torch.float64), 1e-6
    slope = (interpolate(x0, noise, t + h) - interpolate(x0, noise, t - h)) / (2 * h)
    torch.testing.assert_close(slope, velocity_target(x0, noise), rtol=1e-6, atol=1e-6)


def test_sampling_with_the_true_velocity_of_a_straight_path_returns_the_data():
    x0, noise = pair(2)
    for sampler in (euler_sample, heun_sample):
        out = sampler(lambda x, t: velocity_target(x0, noise), noise, 3)
        torch.testing.assert_close(out, x0, rtol=0, atol=1e-12)


# ---- the samplers' orders on dx/dt = lam * x, whose solution from t = 1 to t = 0 is x(1) * exp(-lam) ------------
LAM = 1.5


def _error(sampler, steps: int, shift: float | None = None) -> float:
    x1 = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    out = sampler(lambda x, t: LAM * x, x1, steps, shift)
    return (out - x1 * math.exp(-LAM)).abs().max().item()


@pytest.mark.parametrize("sampler, order", [(euler_sample, 1), (heun_sample, 2)])
@pytest.mark.parametrize("shift", [None, 3.0])
def test_samplers_converge_at_their_order(sampler, order, shift):
    errors = [_error(sampler, n, shift) for n in (16, 32, 64, 128)]
    rates = [math.log2(a / b) for a, b in zip(errors, errors[1:])]
    assert all(abs(r - order) < 0.15 for r in rates), rates
    assert errors[-1] < (1e-2 if order == 1 else 1e-4)


def test_samplers_pass_one_time_per_sample_from_one_down():
    seen = []
    euler_sample(lambda x, t: seen.append(t) or torch.zeros_like(x), torch.zeros(2, 3), 4)
    assert [t.tolist() for t in seen] == [[1.0, 1.0], [0.75, 0.75], [0.5, 0.5], [0.25, 0.25]]
    assert all(t.dtype == torch.float32 and t.shape == (2,) for t in seen)


def test_time_grid_ends_at_zero_and_its_steps_sum_to_one():
    for shift in (None, 0.5, 3.0):
        times, sizes = time_grid(7, shift)
        assert times[0] == 1.0 and len(times) == len(sizes) == 7
        assert sum(sizes) == pytest.approx(1.0) and times[-1] - sizes[-1] == pytest.approx(0.0, abs=1e-15)
        assert all(h > 0 for h in sizes)
    _, sizes = time_grid(7, 3.0)
    assert sizes[0] < sizes[-1]  # shift > 1: finer steps near the noisy end


# ---- training times -------------------------------------------------------------------------------------------------
U = torch.rand(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_uniform_time_is_the_draw():
    assert uniform_time(U) is U
    assert sample_time(U, "uniform").mean().item() == pytest.approx(0.5, abs=5e-3)


def test_beta_time_is_pi0s_draw():
    t = beta_time(U)
    # Exactly the expression pi0-style training has always used (the flow VLA's times depend on it bitwise).
    torch.testing.assert_close(t, 0.999 * U.pow(1 / 1.5) + 0.001, rtol=0, atol=0)
    assert t.min().item() >= 0.001 and t.max().item() <= 1.0
    assert t.mean().item() == pytest.approx(0.999 * 1.5 / 2.5 + 0.001, abs=5e-3)  # Beta(1.5, 1) has mean 0.6
    torch.testing.assert_close(sample_time(U, "beta", alpha=1.5, low=0.001), t, rtol=0, atol=0)


def test_logit_normal_time_is_a_sigmoid_of_a_normal():
    t = logit_normal_time(U, mean=0.5, std=0.8)
    assert t.min().item() > 0 and t.max().item() < 1
    logits = torch.logit(t)
    assert logits.mean().item() == pytest.approx(0.5, abs=1e-2)
    assert logits.std().item() == pytest.approx(0.8, abs=1e-2)
    assert logit_normal_time(U).median().item() == pytest.approx(0.5, abs=5e-3)


def test_shift_is_monotone_keeps_the_ends_and_moves_toward_noise():
    t = torch.linspace(0, 1, 101, dtype=torch.float64)
    for shift in (0.5, 1.0, 3.0):
        s = shift_time(t, shift)
        assert torch.all(s[1:] > s[:-1])
        assert s[0].item() == 0.0 and s[-1].item() == pytest.approx(1.0, abs=1e-15)
    torch.testing.assert_close(shift_time(t, 1.0), t, rtol=0, atol=0)
    assert torch.all(shift_time(t, 3.0)[1:-1] > t[1:-1])
    assert shift_time(0.5, 3.0) == pytest.approx(0.75)
    shifted = sample_time(U, "logit_normal", shift=3.0)
    assert shifted.mean().item() > logit_normal_time(U).mean().item()


def test_mode_time_is_sd3s_draw():
    from longboat.models.generative.flow_matching import mode_time

    u = torch.linspace(0, 1, 101, dtype=torch.float64)
    torch.testing.assert_close(mode_time(u, 0.0), 1 - u)
    t = mode_time(u, 1.29)
    assert t[0] == 1 and abs(float(t[-1])) < 1e-12 and torch.all(t[1:] < t[:-1])
    middle = ((t > 0.25) & (t < 0.75)).double().mean()
    assert middle > ((1 - u > 0.25) & (1 - u < 0.75)).double().mean()
