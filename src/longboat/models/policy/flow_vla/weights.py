"""The flow VLA's initial weights: its backbone's, read from ``backbone_hf`` through the decoder's HF import."""

from __future__ import annotations

import torch

from longboat.models.policy.flow_vla.config import FlowVLAConfig


class BackboneWeights:
    """``ModelSpec.initial_weights`` of the flow VLA: the pretrained backbone, the rest initialised at random."""

    def source(self, cfg: FlowVLAConfig) -> str | None:
        return cfg.backbone_hf

    def read(self, cfg: FlowVLAConfig) -> dict[str, torch.Tensor]:
        """The backbone's tensors under the policy's names (``backbone.*``), only the layers it uses."""
        from longboat.models import get_model

        state = get_model("decoder").hf.read_weights(cfg.backbone_hf, cfg.backbone)
        dropped = tuple(f"layers.{i}." for i in range(cfg.n_layers, cfg.backbone.n_layers))
        return {f"backbone.{name}": t for name, t in state.items() if not name.startswith(dropped)}
