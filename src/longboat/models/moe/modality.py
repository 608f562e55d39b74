"""Mixture of experts in two groups chosen by token type (ERNIE-4.5-VL): text tokens go to the text experts, image
tokens to the vision experts, each group with its own router, selection bias and expert width; shared experts see
every token.

Routing is per token and dropless, so running each group on its own tokens gives what one layer over the whole batch
would for that group. A batch with no vision token runs the text group on every token (and the vision group on none).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from longboat.models.moe.config import MoEConfig
from longboat.models.moe.experts import SwiGLU
from longboat.models.moe.layer import MoE


class ModalityMoE(nn.Module):
    """forward(x [B, T, d], vision [B, T] bool or None) -> (y [B, T, d], aux). ``text``'s shared experts (if any)
    become this layer's, applied to every token; ``vision`` has none of its own. aux: the groups' losses summed, their
    ``load`` and ``dropped`` counts side by side (text experts, then vision experts)."""

    def __init__(self, text: MoEConfig, vision: MoEConfig) -> None:
        super().__init__()
        if vision.d_model != text.d_model:
            raise ValueError(f"the vision experts' d_model ({vision.d_model}) must equal the text experts' "
                             f"({text.d_model})")
        if vision.n_shared_experts:
            raise ValueError("the vision experts have no shared experts of their own: the text group's see every "
                             "token")
        if vision.capacity_factor is not None or text.capacity_factor is not None:
            raise ValueError("experts routed by token type are dropless (capacity_factor None)")
        self.d_model = text.d_model
        self.text = MoE(text.model_copy(update={"n_shared_experts": 0, "shared_expert_gate": False}))
        self.vision = MoE(vision)
        self.shared_experts = SwiGLU(text.d_model, text.shared_dim) if text.n_shared_experts else None
        if text.shared_expert_gate:
            raise ValueError("experts routed by token type sum their shared experts ungated")
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, out_std: float | None = None) -> None:
        self.text.init_weights(std, out_std)
        self.vision.init_weights(std, out_std)
        if self.shared_experts is not None:
            self.shared_experts.init_weights(std, std if out_std is None else out_std)

    def forward(self, x: Tensor, vision: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        shape = x.shape
        tokens = x.reshape(-1, self.d_model)
        mask = torch.zeros(len(tokens), dtype=torch.bool, device=x.device) if vision is None else vision.reshape(-1)
        out = torch.empty_like(tokens)
        text_out, aux = self.text(tokens[~mask])  # a group without tokens runs on none (every rank steps alike)
        vision_out, vision_aux = self.vision(tokens[mask])
        out[~mask], out[mask] = text_out.to(out.dtype), vision_out.to(out.dtype)
        aux = {"loss": aux["loss"] + vision_aux["loss"],
               "load": torch.cat([aux["load"], vision_aux["load"]]),  # text experts, then vision experts
               "dropped": torch.cat([aux["dropped"], vision_aux["dropped"]])}
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return out.view(shape), aux

    @torch.no_grad()
    def record_load(self, load: Tensor) -> None:
        """Add one forward's aux["load"] (text experts, then vision experts) to each group's count."""
        n = self.text.cfg.n_experts
        self.text.record_load(load[:n])
        self.vision.record_load(load[n:])
