"""Diffusion Policy (Chi et al., 2023): an action chunk denoised from Gaussian noise by a 1-D U-Net conditioned on
the observation window. Training is DDPM's denoising loss at a random timestep; inference runs a few DDIM steps."""

from __future__ import annotations

import torch

from longboat.config.base import ConfigError
from longboat.models.generative.ddpm import NoiseScheduler
from longboat.models.policy.base import Policy
from longboat.models.policy.diffusion.config import DiffusionConfig
from longboat.models.policy.diffusion.encoder import ObservationEncoder
from longboat.models.policy.diffusion.unet import ConditionalUnet1d
from longboat.models.generative.keyed_random import keyed_normal, keyed_randint

# keyed_normal(stream s) reads uniform streams 2s and 2s + 1, keyed_randint(stream s) uniform stream s.
_NOISE_STREAM = 0
_TIMESTEP_STREAM = 2
_STEP_STREAM = 8  # DDPM's per-step noise at inference: keyed_normal streams 8, 9, ...


class DiffusionPolicy(Policy):
    def __init__(self, cfg: DiffusionConfig):
        super().__init__(cfg)
        if cfg.action_dim == 0:
            raise ConfigError("model.action_dim is 0: the policy task fills it from the dataset before building")
        self.encoder = ObservationEncoder(cfg)
        self.unet = ConditionalUnet1d(cfg, self.encoder.out_dim)
        self.scheduler = NoiseScheduler(cfg.train_timesteps, cfg.prediction,
                                        cfg.clip_sample_range if cfg.clip_sample else None, cfg.beta_schedule,
                                        cfg.spacing, cfg.float32_tables, cfg.sampler)

    @torch.no_grad()
    def init_weights(self) -> None:
        """PyTorch's default initialisation of every layer (as Diffusion Policy trains); valid after ``to_empty``,
        so ``parallel.meta_init`` can build the policy."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """Per-sample denoising loss: the MSE of the U-Net's prediction (noise or clean actions) at the sample's
        timestep, both drawn from its ``noise_key``."""
        actions = batch[self.cfg.action_feature]  # [B, horizon, A]
        keys = batch["noise_key"]
        noise = keyed_normal(keys, tuple(actions.shape[1:]), _NOISE_STREAM, actions.dtype)
        t = keyed_randint(keys, (), self.cfg.train_timesteps, _TIMESTEP_STREAM)
        prediction = self.unet(self.scheduler.add_noise(actions, noise, t), t, self.encoder(batch))
        error = (prediction - self.scheduler.target(actions, noise)).square().mean(dim=-1)  # [B, horizon]
        if self.cfg.mask_padding:
            valid = (~batch["action_is_pad"]).to(error.dtype)
            return {"loss": (error * valid).sum(1) / valid.sum(1).clamp(min=1)}
        return {"loss": error.mean(dim=1)}

    @torch.no_grad()
    def predict(self, obs: dict, noise_key: torch.Tensor | None = None) -> torch.Tensor:
        """The chunk from ``first_action`` on; the initial noise (and DDPM's per-step noise) drawn from
        ``noise_key`` when given."""
        cond = self.encoder(obs)
        shape = (cond.shape[0], self.cfg.horizon, self.cfg.action_dim)
        step_noise = None
        if noise_key is None:
            noise = torch.randn(shape, device=cond.device, dtype=cond.dtype)
        else:
            key = noise_key.to(cond.device)
            noise = keyed_normal(key, shape[1:], _NOISE_STREAM, cond.dtype)

            def step_noise(i: int) -> torch.Tensor:
                return keyed_normal(key, shape[1:], _STEP_STREAM + i, cond.dtype)
        return self.denoise(cond, noise, step_noise)[:, self.cfg.first_action:]

    @torch.no_grad()
    def denoise(self, cond: torch.Tensor, noise: torch.Tensor, step_noise=None) -> torch.Tensor:
        """The whole denoised horizon [B, horizon, A] from the conditioning ``encoder(obs)``, the initial noise and,
        for DDPM, ``step_noise(i)`` giving step i's fresh noise."""
        return self.scheduler.sample(lambda x, t: self.unet(x, t, cond), noise, self.cfg.inference_steps, step_noise)
