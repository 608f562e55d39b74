"""ACT: Action Chunking with Transformers (Zhao et al., 2023), as plain single-device PyTorch.

Observation encoder: each camera's image goes through one shared ResNet, a 1x1 convolution to ``d_model`` and
2-D sinusoidal positions; the CVAE latent and the state are two more tokens with learned positions. A transformer
encoder runs over [latent, state, image tokens]; a decoder's ``horizon`` learned queries cross-attend to it, and a
linear head reads one action per query.

CVAE: in training a small transformer encoder reads [CLS, state, action chunk] (padded steps masked) and
gives the mean and log-variance of the latent, sampled from the sample's ``noise_key``; at inference the latent
is the prior's mean, zero. The loss of a sample is its mean L1 error over the real (unpadded) action elements
plus ``kl_weight`` times the KL divergence of its posterior from the standard normal.
"""

from __future__ import annotations

import torch
from torch import nn

from longboat.config.base import ConfigError
from longboat.models.policy.act.config import ACTConfig
from longboat.models.policy.act.transformer import Decoder, Encoder, sinusoid_1d, sinusoid_2d
from longboat.models.policy.base import Policy
from longboat.models.generative.keyed_random import keyed_normal
from longboat.models.vision import ResNet

_LATENT_STREAM = 0  # the keyed-random stream of the CVAE sample


class ACT(Policy):
    def __init__(self, cfg: ACTConfig):
        super().__init__(cfg)
        if cfg.action_dim == 0:
            raise ConfigError("model.action_dim is 0: the policy task fills it from the dataset, or set it")
        d = cfg.d_model
        self.cameras = sorted(cfg.image_features)
        has_state = cfg.state_feature is not None

        # CVAE encoder q(z | state, actions), used in training only.
        if cfg.use_vae:
            self.vae_cls = nn.Embedding(1, d)
            self.vae_state_proj = nn.Linear(cfg.state_dim, d) if has_state else None
            self.vae_action_proj = nn.Linear(cfg.action_dim, d)
            self.vae_encoder = Encoder(cfg, cfg.n_vae_encoder_layers)
            self.latent_head = nn.Linear(d, 2 * cfg.latent_dim)
        else:  # an empty stand-in, so the spec's "vae_encoder.layers" parallel unit names a module either way
            self.vae_encoder = nn.Module()
            self.vae_encoder.layers = nn.ModuleList()

        # Observation encoder and action decoder.
        # One backbone for all cameras, as ACT. Without cameras an empty list stands in, so the spec's
        # "backbone" parallel unit names a module either way.
        self.backbone = ResNet(cfg.backbone.model_copy(update={"in_channels": cfg.image_channels})) \
            if self.cameras else nn.ModuleList()
        self.image_proj = nn.Conv2d(cfg.backbone.out_channels, d, 1) if self.cameras else None
        self.latent_proj = nn.Linear(cfg.latent_dim, d)
        self.state_proj = nn.Linear(cfg.state_dim, d) if has_state else None
        self.token_pos = nn.Embedding(2 if has_state else 1, d)  # the latent's and the state's positions
        self.encoder = Encoder(cfg, cfg.n_encoder_layers)
        self.queries = nn.Embedding(cfg.horizon, d)
        self.decoder = Decoder(cfg)
        self.action_head = nn.Linear(d, cfg.action_dim)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """PyTorch's default initialisation, then Xavier-uniform matrices in the transformers (as DETR and ACT);
        valid after ``to_empty``."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        for part in (self.vae_encoder, self.encoder, self.decoder):
            for p in part.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)

    def _state(self, obs: dict) -> torch.Tensor | None:
        return None if self.state_proj is None else obs[self.cfg.state_feature][:, -1]

    def _posterior(self, state: torch.Tensor | None, actions: torch.Tensor,
                   is_pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance [B, latent_dim] of q(z | state, action chunk)."""
        B = actions.shape[0]
        tokens = [self.vae_cls.weight[None].expand(B, -1, -1)]
        if state is not None:
            tokens.append(self.vae_state_proj(state)[:, None])
        tokens.append(self.vae_action_proj(actions))
        x = torch.cat(tokens, dim=1)
        pad = torch.cat([is_pad.new_zeros(B, x.shape[1] - is_pad.shape[1]), is_pad], dim=1)
        pos = sinusoid_1d(x.shape[1], x.shape[2], x.device).to(x.dtype)[None]
        mean, log_var = self.latent_head(self.vae_encoder(x, pos, pad)[:, 0]).chunk(2, dim=-1)
        return mean, log_var

    def _act(self, obs: dict, state: torch.Tensor | None, latent: torch.Tensor) -> torch.Tensor:
        """The action chunk [B, horizon, action_dim] for observations and a latent [B, latent_dim]."""
        B = latent.shape[0]
        tokens = [self.latent_proj(latent)[:, None]]
        if state is not None:
            tokens.append(self.state_proj(state)[:, None])
        pos = [self.token_pos.weight]
        for key in self.cameras:
            features = self.image_proj(self.backbone(obs[key][:, -1]))  # [B, d, h, w]
            tokens.append(features.flatten(2).transpose(1, 2))
            h, w = features.shape[2:]
            pos.append(sinusoid_2d(h, w, features.shape[1], features.device,
                                   self.cfg.positions_2d == "interleaved").to(features.dtype))
        memory_pos = torch.cat(pos)[None]  # [1, tokens, d], the same for every sample
        memory = self.encoder(torch.cat(tokens, dim=1), memory_pos)
        query_pos = self.queries.weight[None].expand(B, -1, -1)
        out = self.decoder(torch.zeros_like(query_pos), query_pos, memory, memory_pos)
        return self.action_head(out)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """Per-sample ``loss`` = ``l1`` + kl_weight * ``kl``, each [B] (``l1`` alone without the CVAE)."""
        actions, is_pad = batch[self.cfg.action_feature], batch["action_is_pad"]
        state = self._state(batch)
        if self.cfg.use_vae:
            mean, log_var = self._posterior(state, actions, is_pad)
            eps = keyed_normal(batch["noise_key"], (self.cfg.latent_dim,), _LATENT_STREAM).to(mean)
            latent = mean + (0.5 * log_var).exp() * eps
        else:
            ref = self.latent_proj.weight
            latent = torch.zeros(actions.shape[0], self.cfg.latent_dim, device=ref.device, dtype=ref.dtype)
        pred = self._act(batch, state, latent)
        real = (~is_pad)[..., None].to(pred.dtype)  # [B, horizon, 1]
        l1 = ((pred - actions).abs() * real).sum((1, 2)) / (real.sum((1, 2)) * self.cfg.action_dim).clamp(min=1)
        if not self.cfg.use_vae:
            return {"loss": l1, "l1": l1}
        kl = 0.5 * (mean.square() + log_var.exp() - 1 - log_var).sum(-1)
        return {"loss": l1 + self.cfg.kl_weight * kl, "l1": l1, "kl": kl}

    @torch.no_grad()
    def predict(self, obs: dict, noise_key: torch.Tensor | None = None) -> torch.Tensor:
        """The action chunk at the prior's mean latent (zero), as ACT acts; deterministic, so ``noise_key`` is
        unused."""
        state = self._state(obs)
        B = (state if state is not None else obs[self.cameras[0]]).shape[0]
        ref = self.latent_proj.weight
        return self._act(obs, state, torch.zeros(B, self.cfg.latent_dim, device=ref.device, dtype=ref.dtype))
