"""SmolVLA's config: the SmolVLM backbone (our composed ``vlm``, its decoder cut to the layers in use), the action
expert beside it, the state token, the image resizing and the flow-matching settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from longboat.config.base import StrictModel
from longboat.models.policy.base import PolicyConfig
from longboat.models.vlm.config import VLMConfig


class SmolVLAExpertConfig(StrictModel):
    """The action expert: a Llama-like stack narrower than the backbone with the backbone's heads (count and size).

    ``attention: cross`` makes layer i's keys and values projections of the backbone layer's prefix keys and values
    (``wk``/``wv`` read the backbone's key width), except every ``self_attn_every``-th layer (0: none), whose
    queries, keys and values are the expert's own, attending to the prefix's keys and values followed by its own
    (causally); ``attention: self`` makes every layer such. With fewer layers than the backbone, expert layer i
    sits beside backbone layer i·(backbone layers / expert layers)."""

    d_model: int = Field(gt=0)
    ffn_dim: int = Field(gt=0)
    n_layers: int = Field(gt=0)
    norm_eps: float = Field(default=1e-5, gt=0)
    attention: Literal["cross", "self"] = "cross"
    self_attn_every: int = Field(default=2, ge=0)


class SmolVLAConfig(PolicyConfig):
    """[image tokens, prompt tokens, state token] through the backbone; [noisy action tokens + time] through the
    expert. Images are resized with padding to ``resize_pad`` ([H, W], padded on the top and left) and scaled to
    [-1, 1] inside the model; state and actions are zero-padded to ``max_state_dim`` / ``max_action_dim``."""

    horizon: int = Field(default=50, gt=0, description="actions predicted per call (SmolVLA's chunk_size)")
    vlm: VLMConfig
    expert: SmolVLAExpertConfig
    resize_pad: list[int] | None = Field(default=None, description="[H, W] the images are resized and padded to")
    max_state_dim: int = Field(default=32, gt=0)
    max_action_dim: int = Field(default=32, gt=0)
    max_prompt_len: int = Field(default=48, gt=0, description="prompt tokens per sample (right-padded)")
    tokenizer: str | None = Field(default=None, description="the backbone's tokenizer directory, for training's "
                                  "prompts (a served import carries its tokenizer files)")
    prompt_suffix: str = Field(default="\n", description="appended to a prompt lacking it (LeRobot's newline)")
    num_steps: int = Field(default=10, gt=0, description="Euler steps from noise (t=1) to actions (t=0)")
    min_period: float = Field(default=4e-3, gt=0)
    max_period: float = Field(default=4.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> SmolVLAConfig:
        language, v = self.vlm.language, self.vlm.vision
        if language.attention != "gqa" or language.moe is not None or language.qk_norm:
            raise ValueError("vlm.language: SmolVLA's expert reads a dense grouped-query decoder without qk_norm")
        if self.expert.d_model % 2:
            raise ValueError(f"expert.d_model ({self.expert.d_model}) must be even (sine-cosine time embedding)")
        if language.n_layers % self.expert.n_layers:
            raise ValueError(f"expert.n_layers ({self.expert.n_layers}) must divide vlm.language.n_layers "
                             f"({language.n_layers})")
        every = language.n_layers // self.expert.n_layers
        missing = [i for i in self.self_attention_layers() if i % every]
        if missing:
            raise ValueError(f"backbone layers {missing} use self-attention but have no expert layer beside them "
                             f"(an expert layer sits beside every {every} backbone layers)")
        if self.n_obs_steps != 1:
            raise ValueError(f"n_obs_steps: SmolVLA reads the current frame only (1), got {self.n_obs_steps}")
        if self.state_dim > self.max_state_dim or self.action_dim > self.max_action_dim:
            raise ValueError(f"state_dim {self.state_dim} / action_dim {self.action_dim} exceed max_state_dim "
                             f"{self.max_state_dim} / max_action_dim {self.max_action_dim}")
        if v.arch != "siglip" or self.vlm.projector.kind != "pixel_shuffle":
            raise ValueError("vlm: SmolVLA reads a SigLIP tower with the pixel_shuffle projector")
        size = [v.image_size, v.image_size]
        if self.resize_pad is not None and self.resize_pad != size:
            raise ValueError(f"resize_pad {self.resize_pad}: images reach the tower at its size {size}")
        for key, shape in self.image_features.items():
            if self.resize_pad is None and shape[1:] != size:
                raise ValueError(f"image_features.{key}: {shape[1:]} is not the tower's size {size}; set resize_pad")
        return self

    def self_attention_layers(self) -> list[int]:
        """Backbone layers whose expert layer attends with its own keys and values."""
        n, every = self.vlm.language.n_layers, self.expert.self_attn_every
        if self.expert.attention == "self":
            return list(range(n))
        return [i for i in range(n) if every > 0 and i % every == 0]

    @property
    def image_tokens(self) -> int:
        v, m = self.vlm.vision, self.vlm.projector.merge_size
        return len(self.image_features) * (v.image_size // v.patch_size // m) ** 2
