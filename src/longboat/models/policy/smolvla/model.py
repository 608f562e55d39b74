"""SmolVLA (Shukor et al., 2025): a SmolVLM backbone cut to its first layers and an action expert trained by flow
matching, as LeRobot builds it.

Prefix: each camera's image resized with padding and scaled to [-1, 1], through SigLIP and the pixel-shuffle
connector, times sqrt(d_model); the prompt's token embeddings times sqrt(d_model); the state (zero-padded) projected
to one token. Images and prompt see each other; the state token sees them and itself. Positions count the valid
tokens. The backbone layers run once per call, keeping each layer's rotated keys and values; the expert
(``expert.py``) reads them at every Euler step. Noisy actions with the flow time's sine-cosine embedding go
through a two-layer swish MLP into the expert; action tokens attend causally among themselves.

Training (flow matching): t = 0.999·Beta(1.5, 1) + 0.001, x_t = t·noise + (1 − t)·actions, and the output
regresses u = noise − actions over the padded action width; inference integrates from t = 1 in ``num_steps``
Euler steps.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from longboat.models.generative.flow_matching import euler_sample, interpolate, sample_time, velocity_target
from longboat.models.generative.keyed_random import keyed_normal, keyed_uniform
from longboat.models.policy.base import Policy
from longboat.models.policy.flow_vla.expert import time_embedding
from longboat.models.policy.flow_vla.prefix import PrefixBlock
from longboat.models.policy.smolvla.config import SmolVLAConfig
from longboat.models.policy.smolvla.expert import SmolVLAExpert
from longboat.models.vlm.model import VLM

TIME_STREAM, NOISE_STREAM, SAMPLE_STREAM = 0, 1, 2


def resize_with_pad(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[B, C, h, w] -> [B, C, height, width]: bilinear resize keeping the aspect ratio (no antialiasing), zeros
    padded on the top and left, as LeRobot's SmolVLA."""
    h, w = images.shape[-2:]
    ratio = max(w / width, h / height)
    new_h, new_w = int(h / ratio), int(w / ratio)
    resized = F.interpolate(images, size=(new_h, new_w), mode="bilinear", align_corners=False)
    return F.pad(resized, (max(0, width - new_w), 0, max(0, height - new_h), 0), value=0)


def pad_last(x: torch.Tensor, n: int) -> torch.Tensor:
    return F.pad(x, (0, n - x.shape[-1])) if x.shape[-1] < n else x


class SmolVLA(Policy):
    extra_inputs = ("prompt_tokens", "prompt_mask")

    def __init__(self, cfg: SmolVLAConfig):
        super().__init__(cfg)
        self.cameras = list(cfg.image_features)
        self.vlm = VLM(cfg.vlm)
        d, width = cfg.vlm.language.d_model, cfg.expert.d_model
        self.state_proj = nn.Linear(cfg.max_state_dim, d)
        self.action_in = nn.Linear(cfg.max_action_dim, width)
        self.time_mlp_in = nn.Linear(2 * width, width)
        self.time_mlp_out = nn.Linear(width, width)
        self.expert = SmolVLAExpert(cfg)
        self.action_out = nn.Linear(width, cfg.max_action_dim)

    # ---- prefix ------------------------------------------------------------------------------------------
    def embed_prefix(self, obs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(embeddings [B, P, d], valid [B, P], the state token's flag [P]) of [images, prompt, state]."""
        d = self.cfg.vlm.language.d_model
        tokens, valid = [], []
        for cam in self.cameras:
            image = obs[cam][:, -1]
            if self.cfg.resize_pad is not None:
                image = resize_with_pad(image, *self.cfg.resize_pad)
            image = image * 2.0 - 1.0
            features = self.vlm.image_features(image).view(image.shape[0], -1, d)
            tokens.append(features * torch.tensor(d**0.5, dtype=features.dtype, device=features.device))
            valid.append(torch.ones(features.shape[:2], dtype=torch.bool, device=image.device))
        tokens.append(self.vlm.language.tok_embeddings(obs["prompt_tokens"]) * math.sqrt(d))
        valid.append(obs["prompt_mask"].bool())
        state = pad_last(obs[self.cfg.state_feature][:, -1], self.cfg.max_state_dim)
        tokens.append(self.state_proj(state)[:, None])
        valid.append(torch.ones(state.shape[0], 1, dtype=torch.bool, device=state.device))
        h = torch.cat(tokens, dim=1)
        is_state = torch.zeros(h.shape[1], dtype=torch.bool, device=h.device)
        is_state[-1] = True
        return h, torch.cat(valid, dim=1), is_state

    def encode_prefix(self, obs: dict) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """(each backbone layer's rotated prefix keys and values, prefix_valid [B, P])."""
        h, valid, is_state = self.embed_prefix(obs)
        P = h.shape[1]
        # Images and prompt see each other, the state token sees all; padding sees itself only (no empty row).
        sees = is_state[:, None] | ~is_state[None, :]
        eye = torch.eye(P, dtype=torch.bool, device=h.device)
        mask = ((sees[None] & valid[:, None, :] & valid[:, :, None]) | eye)[:, None]
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        language = self.vlm.language
        cos, sin = language.rope_cos[positions], language.rope_sin[positions]
        kv = []
        for layer in language.layers:  # each layer's keys and values for the expert, as the flow VLA takes them
            h, k, v = PrefixBlock(layer)(h, cos, sin, mask)
            kv.append((k, v))
        return kv, valid

    # ---- suffix ------------------------------------------------------------------------------------------
    def velocity(self, prefix_kv: list, prefix_valid: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
                 ) -> torch.Tensor:
        """The velocity [B, horizon, max_action_dim] at noisy actions x_t and times t [B]."""
        actions = self.action_in(x_t)
        times = time_embedding(t, actions.shape[-1], self.cfg.min_period, self.cfg.max_period)
        h = torch.cat((actions, times[:, None].expand_as(actions)), dim=-1)
        h = self.time_mlp_out(F.silu(self.time_mlp_in(h)))
        B, S = h.shape[:2]
        steps = torch.arange(S, device=h.device)
        language = self.vlm.language
        own = prefix_valid.sum(dim=1, keepdim=True) + steps  # self-attention: after the valid prefix
        rope = {"cross": (language.rope_cos[steps], language.rope_sin[steps]),
                "self": (language.rope_cos[own], language.rope_sin[own])}
        seen = prefix_valid[:, None, :].expand(B, S, -1)
        causal = (steps[None, :] <= steps[:, None]).expand(B, S, S)
        masks = {"cross": seen[:, None], "self": torch.cat((seen, causal), dim=-1)[:, None]}
        out = self.expert(h, rope, prefix_kv, masks)
        return self.action_out(out[:, -self.cfg.horizon:])

    # ---- the policy contract -----------------------------------------------------------------------------
    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        actions = pad_last(batch[self.cfg.action_feature], self.cfg.max_action_dim)
        keys = batch["noise_key"]
        t = sample_time(keyed_uniform(keys, (), TIME_STREAM), "beta", alpha=1.5, low=0.001).to(actions)
        noise = keyed_normal(keys, tuple(actions.shape[1:]), NOISE_STREAM).to(actions)
        prefix_kv, prefix_valid = self.encode_prefix(batch)
        v = self.velocity(prefix_kv, prefix_valid, interpolate(actions, noise, t), t)
        keep = (~batch["action_is_pad"]).to(actions.dtype)[:, :, None]
        squared = (v - velocity_target(actions, noise)).square() * keep
        return {"loss": squared.mean(dim=(1, 2))}

    @torch.no_grad()
    def predict(self, obs: dict, noise_key: torch.Tensor | None = None, noise: torch.Tensor | None = None
                ) -> torch.Tensor:
        """The chunk [B, horizon, action_dim]; ``noise`` [B, horizon, max_action_dim] replaces the draw."""
        prefix_kv, prefix_valid = self.encode_prefix(obs)
        ref = self.action_out.weight
        shape = (self.cfg.horizon, self.cfg.max_action_dim)
        if noise is None and noise_key is not None:
            noise = keyed_normal(noise_key, shape, SAMPLE_STREAM)
        elif noise is None:
            noise = torch.randn(prefix_valid.shape[0], *shape, device=ref.device)
        x = euler_sample(lambda x_t, t: self.velocity(prefix_kv, prefix_valid, x_t, t), noise.to(ref),
                         self.cfg.num_steps)
        return x[..., :self.cfg.action_dim]

    def param_groups(self) -> dict[str, tuple[list[str], float]]:
        """As LeRobot trains SmolVLA by default (``train_expert_only``): the backbone frozen, the rest trained."""
        return {"expert": ([n for n, _ in self.named_parameters() if not n.startswith("vlm.")], 1.0)}
