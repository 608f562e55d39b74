"""A flow-matching vision-language-action policy in the style of pi0 (Black et al., 2024).

Prefix: each camera's image through a small ViT, projected to the backbone's width, then the task prompt's token
embeddings; a longboat decoder reads the prefix with bidirectional attention (pi0's prefix-LM mask) and hands each
layer's keys and values (``prefix.py``) to the action expert (``expert.py``), which reads [state, noisy
actions + flow time].

Training (flow matching, ``models/generative/flow_matching.py``): t = 0.999·Beta(1.5, 1) + 0.001,
x_t = t·noise + (1 − t)·actions, and the expert's output regresses the velocity u = noise − actions. Inference
integrates dx/dt = v from t = 1 (noise) to t = 0 with ``num_steps`` Euler steps; the prefix's keys and values are
computed once per call.
"""

from __future__ import annotations

import torch
from torch import nn

from longboat.models.generative.flow_matching import euler_sample, interpolate, sample_time, velocity_target
from longboat.models.llm.model import Decoder
from longboat.models.policy.base import Policy
from longboat.models.policy.flow_vla.config import FlowVLAConfig
from longboat.models.policy.flow_vla.expert import ActionExpert
from longboat.models.policy.flow_vla.prefix import PrefixBlock
from longboat.models.generative.keyed_random import keyed_normal, keyed_uniform
from longboat.models.vision.vit import ViT

# Streams of the keyed draws: one per use, so no two draws of a sample share numbers.
TIME_STREAM, NOISE_STREAM, SAMPLE_STREAM = 0, 1, 2


class FlowVLA(Policy):
    extra_inputs = ("prompt_tokens", "prompt_mask")

    def __init__(self, cfg: FlowVLAConfig):
        super().__init__(cfg)
        self.cameras = list(cfg.image_features)
        self.vision = ViT(cfg.vision, tuple(cfg.image_features[self.cameras[0]])) if self.cameras else None
        self.image_proj = nn.Linear(cfg.vision.d_model, cfg.backbone.d_model) if self.cameras else None
        self.backbone = Decoder(cfg.backbone.model_copy(update={"n_layers": cfg.n_layers}))
        # Its layers return their prefix keys and values, so each can be an FSDP and checkpointing unit.
        self.backbone.layers = nn.ModuleList(PrefixBlock(block) for block in self.backbone.layers)
        self.expert = ActionExpert(cfg)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Random initialisation of every part (the backbone's pretrained weights load afterwards)."""
        self.backbone.init_weights()
        if self.vision is not None:
            self.vision.init_weights()
            nn.init.normal_(self.image_proj.weight, std=self.cfg.backbone.init_std)
            nn.init.zeros_(self.image_proj.bias)
        self.expert.init_weights(self.cfg.backbone.init_std)

    # ---- prefix ------------------------------------------------------------------------------------------
    def encode_prefix(self, obs: dict) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """(each layer's prefix keys and values, prefix_valid [B, P]) for [image tokens, prompt tokens]."""
        tokens, valid = [], []
        for cam in self.cameras:
            image = obs[cam][:, -1]  # the current frame [B, C, H, W]
            tokens.append(self.image_proj(self.vision(image)))
            valid.append(torch.ones(tokens[-1].shape[:2], dtype=torch.bool, device=image.device))
        if self.cfg.tokenizer is not None:
            tokens.append(self.backbone.tok_embeddings(obs["prompt_tokens"]))
            valid.append(obs["prompt_mask"].bool())
        h, prefix_valid = torch.cat(tokens, dim=1), torch.cat(valid, dim=1)
        B, P = prefix_valid.shape
        # Bidirectional over the valid prefix; a padding position sees itself too, so no row is empty.
        eye = torch.eye(P, dtype=torch.bool, device=h.device)
        mask = (prefix_valid[:, None, :] | eye)[:, None]
        cos, sin = self.backbone.rope_cos[:P], self.backbone.rope_sin[:P]
        kv = []
        for layer in self.backbone.layers:
            h, k, v = layer(h, cos, sin, mask)
            kv.append((k, v))
        return kv, prefix_valid

    # ---- suffix ------------------------------------------------------------------------------------------
    def velocity(self, obs: dict, prefix_kv: list, prefix_valid: torch.Tensor, x_t: torch.Tensor,
                 t: torch.Tensor) -> torch.Tensor:
        """The expert's velocity [B, horizon, A] at noisy actions x_t and times t [B]."""
        horizon = x_t.shape[1]
        state = obs[self.cfg.state_feature][:, -1] if self.expert.uses_state else None
        S = int(self.expert.uses_state) + horizon
        # Suffix positions continue after the valid prefix (padding takes no position, as in pi0).
        positions = prefix_valid.sum(dim=1, keepdim=True) + torch.arange(S, device=x_t.device)
        cos, sin = self.backbone.rope_cos[positions], self.backbone.rope_sin[positions]
        mask = self.expert.suffix_mask(prefix_valid, horizon)
        return self.expert(state, x_t, t, cos, sin, prefix_kv, mask)

    # ---- the policy contract -----------------------------------------------------------------------------
    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        actions = batch[self.cfg.action_feature]
        keys = batch["noise_key"]
        # Beta(1.5, 1) scaled to (0.001, 1]: mostly noisy times, as pi0.
        t = sample_time(keyed_uniform(keys, (), TIME_STREAM), "beta", alpha=1.5, low=0.001)
        noise = keyed_normal(keys, tuple(actions.shape[1:]), NOISE_STREAM)
        t, noise = t.to(actions), noise.to(actions)
        x_t = interpolate(actions, noise, t)
        prefix_kv, prefix_valid = self.encode_prefix(batch)
        v = self.velocity(batch, prefix_kv, prefix_valid, x_t, t)
        keep = (~batch["action_is_pad"]).to(actions.dtype)[:, :, None]
        squared = (v - velocity_target(actions, noise)).square() * keep
        loss = squared.sum(dim=(1, 2)) / (keep.sum(dim=(1, 2)) * actions.shape[2]).clamp(min=1)
        return {"loss": loss}

    @torch.no_grad()
    def predict(self, obs: dict, noise_key: torch.Tensor | None = None) -> torch.Tensor:
        ref = self.backbone.tok_embeddings.weight
        prefix_kv, prefix_valid = self.encode_prefix(obs)
        B = prefix_valid.shape[0]
        shape = (self.cfg.horizon, self.cfg.action_dim)
        if noise_key is not None:
            x = keyed_normal(noise_key, shape, SAMPLE_STREAM).to(ref)
        else:
            x = torch.randn(B, *shape, device=ref.device, dtype=ref.dtype)
        return euler_sample(lambda x_t, t: self.velocity(obs, prefix_kv, prefix_valid, x_t, t), x, self.cfg.num_steps)

    # ---- optimisation ------------------------------------------------------------------------------------
    def param_groups(self) -> dict[str, tuple[list[str], float]]:
        """component -> (parameter names, learning-rate scale) of the trainable parameters: ``backbone`` (at
        ``backbone_lr_scale``; left out, hence frozen, at 0), ``vision`` and ``expert``.

        The backbone parameters that no output depends on are left out too (data-parallel wrappers require every
        trainable parameter to get a gradient): the final norm and head, and the last layer's query, output and
        feed-forward, since the expert reads only each layer's keys and values (and the embedding without a
        prompt)."""
        unused = {"norm.weight", "output.weight"}
        if self.cfg.tokenizer is None:
            unused.add("tok_embeddings.weight")
        last = f"layers.{len(self.backbone.layers) - 1}."
        last_unused = ("attention.wq.", "attention.wo.", "attention.q_norm.", "ffn_norm.", "feed_forward.")
        backbone = [f"backbone.{n}" for n, _ in self.backbone.named_parameters()
                    if n not in unused and not (n.startswith(last) and n[len(last):].startswith(last_unused))]
        groups = {"backbone": (backbone, self.cfg.backbone_lr_scale)} if self.cfg.backbone_lr_scale > 0 else {}
        if self.vision is not None:
            groups["vision"] = ([f"vision.{n}" for n, _ in self.vision.named_parameters()]
                                + [f"image_proj.{n}" for n, _ in self.image_proj.named_parameters()], 1.0)
        groups["expert"] = ([f"expert.{n}" for n, _ in self.expert.named_parameters()], 1.0)
        return groups
