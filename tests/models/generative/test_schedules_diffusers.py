"""Our flow-matching grid and Euler loop, and our DDIM, against diffusers' schedulers on the same settings."""

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift

from longboat.models.generative.ddpm import NoiseScheduler
from longboat.models.generative.flow_matching import euler_sample, resolution_shift, time_grid


def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A fixed, nonlinear velocity field of x and t."""
    return torch.sin(3 * x) * t.view(-1, 1) - 0.5 * x + t.view(-1, 1) ** 2


def diffusers_flow(steps: int, shift: float | None, mu: float | None = None):
    """diffusers' flow-match Euler scheduler on our grid: Flux's sigmas (1 down to 1/steps, equal steps), shifted by
    ``shift`` or, with ``mu``, by the resolution-dependent exponential shift."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift or 1.0, use_dynamic_shifting=mu is not None)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    return scheduler


@pytest.mark.parametrize("steps,shift", [(10, None), (8, 3.0), (25, 0.5)])
def test_flow_grid_and_euler_loop_equal_diffusers(steps, shift):
    scheduler = diffusers_flow(steps, shift)
    starts, sizes = time_grid(steps, shift)
    ends = [a - h for a, h in zip(starts, sizes)]
    sigmas = scheduler.sigmas.double()
    torch.testing.assert_close(torch.tensor(starts + [0.0], dtype=torch.float64), sigmas, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.tensor(ends, dtype=torch.float64), sigmas[1:], rtol=0, atol=1e-6)
    torch.testing.assert_close(scheduler.timesteps.double(), sigmas[:-1] * 1000, rtol=0, atol=1e-3)

    noise = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    x = noise.clone()
    for timestep in scheduler.timesteps:
        t = (timestep / 1000).expand(x.shape[0])  # diffusers hands the network t·1000
        x = scheduler.step(velocity(x, t), timestep, x).prev_sample
    torch.testing.assert_close(euler_sample(velocity, noise, steps, shift), x, rtol=0, atol=1e-5)


@pytest.mark.parametrize("seq_len", [256, 1024, 4096])
def test_resolution_shift_equals_diffusers_dynamic_shifting(seq_len):
    mu = calculate_shift(seq_len, 256, 4096, 0.5, 1.15)
    shift = resolution_shift(seq_len)
    assert shift == pytest.approx(np.exp(mu), rel=1e-12)
    starts, _ = time_grid(20, shift)
    theirs = diffusers_flow(20, None, mu).sigmas.double()
    torch.testing.assert_close(torch.tensor(starts + [0.0], dtype=torch.float64), theirs, rtol=0, atol=1e-6)
    assert resolution_shift(4096) > resolution_shift(1024) > resolution_shift(256) == pytest.approx(np.exp(0.5))


def diffusers_ddim(ours: NoiseScheduler, beta_schedule: str) -> DDIMScheduler:
    return DDIMScheduler(num_train_timesteps=ours.train_timesteps, beta_schedule=beta_schedule,
                         prediction_type=ours.prediction, clip_sample=ours.clip is not None,
                         clip_sample_range=ours.clip or 1.0, set_alpha_to_one=True, steps_offset=0,
                         timestep_spacing=ours.spacing)


@pytest.mark.parametrize("beta_schedule,spacing,prediction,clip", [
    ("squaredcos_cap_v2", "trailing", "epsilon", 1.0),  # the policies' settings
    ("squaredcos_cap_v2", "trailing", "sample", None),
    ("linear", "leading", "epsilon", None),  # diffusers' defaults, DiT's training betas
    ("linear", "trailing", "sample", 1.0),
])
def test_ddim_equals_diffusers(beta_schedule, spacing, prediction, clip):
    steps = 10  # T / steps whole: diffusers steps to t − T // steps, we to the next listed timestep
    ours = NoiseScheduler(1000, prediction, clip, beta_schedule=beta_schedule, spacing=spacing)
    theirs = diffusers_ddim(ours, beta_schedule)
    # diffusers keeps the betas in float32, we in float64.
    torch.testing.assert_close(ours.alphas_cumprod, theirs.alphas_cumprod.double(), rtol=1e-5, atol=1e-6)
    theirs.set_timesteps(steps)
    assert ours.inference_timesteps(steps) == theirs.timesteps.tolist()

    g = torch.Generator().manual_seed(0)
    noise = torch.randn(3, 5, generator=g)
    outputs = [torch.randn(3, 5, generator=g) for _ in range(steps)]
    timesteps = ours.inference_timesteps(steps)
    x_ours, x_theirs = noise.clone(), noise.clone()
    for i, (t, t_prev) in enumerate(zip(timesteps, timesteps[1:] + [-1])):
        x_ours = ours.step(outputs[i], t, t_prev, x_ours)
        x_theirs = theirs.step(outputs[i], t, x_theirs, eta=0.0).prev_sample
        torch.testing.assert_close(x_ours, x_theirs, rtol=1e-4, atol=1e-4)
    # The whole sampler, the network a fixed function of (x, t).
    denoise = lambda x, t: torch.tanh(x) * (t.view(-1, 1) / 1000)  # noqa: E731
    x = noise.clone()
    for t in theirs.timesteps:
        x = theirs.step(denoise(x, t.expand(3)), t, x, eta=0.0).prev_sample
    torch.testing.assert_close(ours.sample(denoise, noise, steps), x, rtol=1e-4, atol=1e-4)


def test_the_noising_equals_diffusers():
    ours = NoiseScheduler(1000, beta_schedule="linear")
    theirs = DDIMScheduler(beta_schedule="linear")
    g = torch.Generator().manual_seed(0)
    x0, noise, t = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g), torch.tensor([0, 10, 500, 999])
    torch.testing.assert_close(ours.add_noise(x0, noise, t), theirs.add_noise(x0, noise, t), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="spacing 'linspace' is not one of trailing, leading"):
        NoiseScheduler(1000, spacing="linspace")
