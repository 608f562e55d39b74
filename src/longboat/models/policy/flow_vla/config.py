"""The flow-matching VLA's config: features (from the dataset), the ViT, the decoder backbone, the action expert."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator, model_validator

from longboat.config.base import StrictModel
from longboat.errors import LongboatError
from longboat.models.llm import DecoderConfig
from longboat.models.policy.base import PolicyConfig
from longboat.models.vision.vit import ViTConfig


class ExpertConfig(StrictModel):
    """The action expert's width; its depth and attention heads are the backbone's (attention is shared per layer)."""

    d_model: int = Field(default=256, gt=0)
    ffn_dim: int = Field(default=768, gt=0)
    norm_eps: float = Field(default=1e-5, gt=0)

    @model_validator(mode="after")
    def _check(self) -> ExpertConfig:
        if self.d_model % 2:
            raise ValueError(f"expert.d_model ({self.d_model}) must be even (sine-cosine time embedding)")
        return self


def _backbone_fields(hf_dir: str) -> dict:
    """The decoder config fields of a Hugging Face directory; a ValueError saying why it is not one we read."""
    from longboat.models import get_model, hf_spec

    try:
        if hf_spec(hf_dir).name != "decoder":
            raise ValueError(f"{hf_dir} holds a '{hf_spec(hf_dir).name}' model, not a decoder language model")
        return get_model("decoder").hf.config_fields(hf_dir)
    except LongboatError as e:
        raise ValueError(str(e)) from None


class FlowVLAConfig(PolicyConfig):
    """pi0-style: [image tokens, prompt tokens] through the backbone, [state, noisy actions] through the expert."""

    horizon: int = Field(default=10, gt=0, description="actions predicted per call (the action chunk)")
    vision: ViTConfig = ViTConfig()
    backbone: DecoderConfig | None = Field(
        default=None, description="the prefix decoder; None: read from backbone_hf's config.json")
    backbone_hf: str | None = Field(
        default=None, description="a Hugging Face decoder directory whose weights the backbone starts from")
    backbone_layers: int | None = Field(
        default=None, gt=0, description="use the backbone's first N layers (None: all); the expert has as many")
    backbone_lr_scale: float = Field(default=1.0, ge=0, description="the backbone's learning-rate scale; 0: frozen")
    tokenizer: str | None = Field(
        default=None, description="HF tokenizer directory for the task prompt (default: backbone_hf); None: no prompt")
    max_prompt_len: int = Field(default=32, gt=0, description="prompt tokens per sample (right-padded)")
    expert: ExpertConfig = ExpertConfig()
    num_steps: int = Field(default=10, gt=0, description="Euler steps from noise (t=1) to actions (t=0) at inference")

    @model_validator(mode="before")
    @classmethod
    def _backbone_from_hf(cls, data):
        """Without ``backbone``, its fields (and the tokenizer by default) come from ``backbone_hf``'s config.json;
        a directory that is not a supported decoder is reported by the field check below, naming the key."""
        if isinstance(data, dict) and data.get("backbone") is None and data.get("backbone_hf") is not None:
            try:
                fields = _backbone_fields(data["backbone_hf"])
            except ValueError:
                return data
            data = {**data, "backbone": fields}
            if data.get("tokenizer") is None:
                data["tokenizer"] = data["backbone_hf"]
        return data

    @field_validator("backbone_hf")
    @classmethod
    def _check_backbone_hf(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A config that already holds the backbone (a saved run, an export) does not need the directory.
        if value is not None and info.data.get("backbone") is None:
            _backbone_fields(value)
        return value

    @model_validator(mode="after")
    def _resolve(self) -> FlowVLAConfig:
        if self.backbone is None:
            raise ValueError("set backbone_hf (a Hugging Face decoder directory) or backbone (decoder fields)")
        b = self.backbone
        if b.attention != "gqa" or b.moe is not None:
            raise ValueError("backbone: the action expert shares attention with dense grouped-query decoders only "
                             "(no attention: mla, no moe)")
        if self.backbone_layers is not None and self.backbone_layers > b.n_layers:
            raise ValueError(f"backbone_layers ({self.backbone_layers}) exceeds the backbone's {b.n_layers} layers")
        if self.n_obs_steps != 1:
            raise ValueError(f"n_obs_steps: the flow VLA reads the current frame only (1), got {self.n_obs_steps}")
        shapes = {tuple(s) for s in self.image_features.values()}
        if len(shapes) > 1:
            raise ValueError(f"image_features: every camera must have one shape for the shared ViT, got "
                             f"{self.image_features}; resize them to one size")
        for key, (_, height, width) in self.image_features.items():
            if height % self.vision.patch_size or width % self.vision.patch_size:
                raise ValueError(f"image_features.{key}: {height}x{width} does not divide into "
                                 f"vision.patch_size={self.vision.patch_size} patches")
        if self.action_dim > 0 and not self.image_features and self.tokenizer is None:
            raise ValueError("the flow VLA needs a camera (image_features) or a prompt (tokenizer) in its prefix")
        if self.max_positions > b.max_seq_len:
            raise ValueError(f"prefix and suffix need {self.max_positions} positions, beyond "
                             f"backbone.max_seq_len={b.max_seq_len}")
        return self

    @property
    def n_layers(self) -> int:
        """Layers of the backbone in use, and of the expert."""
        return self.backbone_layers or self.backbone.n_layers

    @property
    def image_tokens(self) -> int:
        return sum(self.vision.num_patches(s[1], s[2]) for s in self.image_features.values())

    @property
    def prompt_tokens(self) -> int:
        return self.max_prompt_len if self.tokenizer is not None else 0

    @property
    def max_positions(self) -> int:
        """Rotary positions used: the prefix, then the state token and the action tokens."""
        return self.image_tokens + self.prompt_tokens + (self.state_dim > 0) + self.horizon
