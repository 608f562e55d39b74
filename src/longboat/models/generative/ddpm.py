"""The noise schedule: DDPM forward noising for training (Ho et al., 2020) and DDIM sampling (Song et al., 2021).

The betas follow the squared-cosine schedule (Nichol & Dhariwal, 2021; ``squaredcos_cap_v2`` in diffusers): the
cumulative signal level is ``f(t / T) / f(0)`` with ``f(s) = cos((s + 0.008) / 1.008 * pi / 2)^2``, each beta capped
at 0.999. Sampling uses DDIM with eta 0, so a sample (e.g. a policy's action chunk) is a deterministic function of
its initial noise.
Inference timesteps are spaced from the noisy end ("trailing"), so the first step starts at t = T - 1 where the
initial noise is what training saw.

Settings serve models trained elsewhere (DiT's checkpoints, diffusers' ``DDIMScheduler`` and ``DDPMScheduler``
defaults): ``beta_schedule="linear"`` (DDPM's betas, evenly from 1e-4 to 0.02), ``spacing="leading"`` (timesteps
multiples of T // steps from 0 up, the first step at T - T // steps), ``float32_tables`` (betas and their cumulative
products in float32, as diffusers keeps them) and ``sampler="ddpm"``: DDPM's ancestral steps with the "fixed small"
variance, each step but the last adding fresh noise.
"""

from __future__ import annotations

import math
from typing import Callable

import torch


def squared_cosine_betas(timesteps: int, max_beta: float = 0.999) -> torch.Tensor:
    """The squared-cosine betas, float64 [timesteps]."""
    def f(s: float) -> float:
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

    # A constant table, always on the CPU (also when a model is built on the meta device); used on any device.
    return torch.tensor([min(1 - f((i + 1) / timesteps) / f(i / timesteps), max_beta) for i in range(timesteps)],
                        dtype=torch.float64, device="cpu")


def squared_cosine_alphas_cumprod(timesteps: int, max_beta: float = 0.999) -> torch.Tensor:
    """Cumulative products of (1 - beta_t), float64 [timesteps]."""
    return torch.cumprod(1 - squared_cosine_betas(timesteps, max_beta), dim=0)


def linear_betas(timesteps: int, start: float = 1e-4, end: float = 0.02) -> torch.Tensor:
    """DDPM's betas, evenly spaced from ``start`` to ``end``, float64 [timesteps] on the CPU."""
    return torch.linspace(start, end, timesteps, dtype=torch.float64, device="cpu")


BETA_SCHEDULES = {"squaredcos_cap_v2": squared_cosine_betas, "linear": linear_betas}
SPACINGS = ("trailing", "leading")


class NoiseScheduler:
    """Noises clean samples at a timestep and denoises pure noise in a few DDIM steps.

    ``prediction`` says what the network outputs: the noise (``epsilon``), the clean sample (``sample``) or the
    velocity ``v = sqrt(alpha_bar)·noise − sqrt(1 − alpha_bar)·x0`` (``v``; Salimans & Ho, 2022).
    ``clip`` bounds predicted clean samples to [-clip, clip] (None: unbounded). ``beta_schedule``: one of
    BETA_SCHEDULES; ``spacing``: how inference timesteps are spread, one of SPACINGS.
    """

    def __init__(self, train_timesteps: int, prediction: str = "epsilon", clip: float | None = 1.0,
                 beta_schedule: str = "squaredcos_cap_v2", spacing: str = "trailing", float32_tables: bool = False,
                 sampler: str = "ddim"):
        if beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"beta_schedule {beta_schedule!r} is not one of {', '.join(BETA_SCHEDULES)}")
        if spacing not in SPACINGS:
            raise ValueError(f"spacing {spacing!r} is not one of {', '.join(SPACINGS)}")
        self.train_timesteps = train_timesteps
        self.prediction = prediction
        self.clip = clip
        self.spacing = spacing
        if sampler not in ("ddim", "ddpm"):
            raise ValueError(f"sampler {sampler!r} is not ddim or ddpm")
        self.sampler = sampler
        betas = BETA_SCHEDULES[beta_schedule](train_timesteps)
        self.alphas_cumprod = torch.cumprod(1 - (betas.float() if float32_tables else betas), dim=0)

    def _alpha_bar(self, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """alphas_cumprod at timesteps ``t`` [B] (t < 0: 1, the clean end), shaped to broadcast over ``like``."""
        table = torch.cat([self.alphas_cumprod.new_ones(1), self.alphas_cumprod]).to(like.device)
        return table[t + 1].to(like.dtype).reshape(-1, *([1] * (like.ndim - 1)))

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) noise, per sample timestep ``t`` [B]."""
        a = self._alpha_bar(t, x0)
        return a.sqrt() * x0 + (1 - a).sqrt() * noise

    def target(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        """What the network is trained to output (``v`` needs the timesteps ``t`` [B])."""
        if self.prediction == "v":
            if t is None:
                raise ValueError("the v target depends on the timestep: pass t")
            a = self._alpha_bar(t, x0)
            return a.sqrt() * noise - (1 - a).sqrt() * x0
        return noise if self.prediction == "epsilon" else x0

    def snr(self, t: torch.Tensor) -> torch.Tensor:
        """Signal-to-noise ratio alpha_bar / (1 − alpha_bar) at timesteps ``t`` [B], float64."""
        a = self.alphas_cumprod.to(t.device)[t]
        return a / (1 - a)

    def inference_timesteps(self, steps: int) -> list[int]:
        """``steps`` timesteps, descending. Trailing: from T - 1 down, evenly spaced, the last ``T / steps - 1``;
        leading: (steps - 1 - i)·(T // steps), the last 0."""
        if self.spacing == "leading":
            return [(steps - 1 - i) * (self.train_timesteps // steps) for i in range(steps)]
        ratio = self.train_timesteps / steps
        return [round(self.train_timesteps - i * ratio) - 1 for i in range(steps)]

    def step(self, output: torch.Tensor, t: int, t_prev: int, x_t: torch.Tensor) -> torch.Tensor:
        """One DDIM step (eta 0) from ``x_t`` at ``t`` to ``t_prev`` (-1: the clean sample)."""
        batch = x_t.shape[0]
        a_t = self._alpha_bar(torch.full((batch,), t, device=x_t.device), x_t)
        a_prev = self._alpha_bar(torch.full((batch,), t_prev, device=x_t.device), x_t)
        if self.prediction == "epsilon":
            eps = output
            x0 = (x_t - (1 - a_t).sqrt() * eps) / a_t.sqrt()
        elif self.prediction == "v":
            x0 = a_t.sqrt() * x_t - (1 - a_t).sqrt() * output
            eps = (1 - a_t).sqrt() * x_t + a_t.sqrt() * output
        else:
            x0 = output
            eps = (x_t - a_t.sqrt() * x0) / (1 - a_t).sqrt()
        if self.clip is not None:
            x0 = x0.clamp(-self.clip, self.clip)
        return a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps

    def ddpm_step(self, output: torch.Tensor, t: int, t_prev: int, x_t: torch.Tensor,
                  noise: torch.Tensor | None) -> torch.Tensor:
        """One DDPM step from ``x_t`` at ``t`` to ``t_prev`` (-1: the clean sample): the posterior mean, plus the
        "fixed small" standard deviation times ``noise`` (None on the last step). Epsilon or sample prediction."""
        batch = x_t.shape[0]
        a_t = self._alpha_bar(torch.full((batch,), t, device=x_t.device), x_t)
        a_prev = self._alpha_bar(torch.full((batch,), t_prev, device=x_t.device), x_t)
        beta_t, beta_prev = 1 - a_t, 1 - a_prev
        alpha_step = a_t / a_prev
        beta_step = 1 - alpha_step
        if self.prediction == "epsilon":
            x0 = (x_t - beta_t ** 0.5 * output) / a_t ** 0.5
        elif self.prediction == "sample":
            x0 = output
        else:
            raise ValueError("the DDPM sampler reads epsilon or sample predictions")
        if self.clip is not None:
            x0 = x0.clamp(-self.clip, self.clip)
        mean = (a_prev ** 0.5 * beta_step) / beta_t * x0 + alpha_step ** 0.5 * beta_prev / beta_t * x_t
        if noise is None:
            return mean
        variance = (beta_prev / beta_t * beta_step).clamp(min=1e-20)
        return mean + variance ** 0.5 * noise

    def sample(self, denoise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], noise: torch.Tensor,
               steps: int, step_noise: Callable[[int], torch.Tensor] | None = None) -> torch.Tensor:
        """Denoise ``noise`` [B, ...] in ``steps`` steps; ``denoise(x_t, t [B])`` is the network. The DDPM sampler
        draws its per-step noise from ``step_noise(i)`` (i = 0, 1, ... for every step but the last, in order)."""
        x = noise
        timesteps = self.inference_timesteps(steps)
        for i, (t, t_prev) in enumerate(zip(timesteps, timesteps[1:] + [-1])):
            out = denoise(x, torch.full((x.shape[0],), t, device=x.device, dtype=torch.long))
            if self.sampler == "ddpm":
                fresh = None
                if t > 0:
                    fresh = step_noise(i) if step_noise is not None else torch.randn_like(x)
                x = self.ddpm_step(out, t, t_prev, x, fresh)
            else:
                x = self.step(out, t, t_prev, x)
        return x
