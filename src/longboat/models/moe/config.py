"""Configuration of a mixture-of-experts feed-forward layer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from longboat.config.base import StrictModel


class MoEConfig(StrictModel):
    """Routed SwiGLU experts (+ optional shared experts) replacing a decoder's dense feed-forward.

    Covers the Mixtral / Qwen-MoE family (softmax top-k) and the DeepSeek-V3 family (sigmoid scores,
    group-limited routing, aux-loss-free bias balancing, shared experts, routed scaling).
    """

    d_model: int = Field(gt=0)
    n_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    expert_ffn_dim: int = Field(gt=0)

    # Shared experts see every token. DeepSeek sums them in; Qwen2-MoE scales them by a sigmoid gate.
    n_shared_experts: int = Field(default=0, ge=0)
    shared_ffn_dim: int | None = Field(default=None, gt=0, description="per shared expert; default expert_ffn_dim")
    shared_expert_gate: bool = False

    # Routing.
    score_func: Literal["softmax", "sigmoid"] = "softmax"
    norm_topk_prob: bool = True
    # ERNIE-4.5 divides the chosen weights by max(sum, this); by default they are divided by sum + 1e-20.
    topk_norm_min: float | None = Field(default=None, gt=0)
    routed_scaling_factor: float = Field(default=1.0, gt=0)
    n_groups: int = Field(default=1, gt=0)
    topk_groups: int = Field(default=1, gt=0)
    router_dtype: Literal["float32", "input"] = "float32"

    # Aux-loss-free balancing (DeepSeek-V3): a bias added to the scores for expert selection only.
    use_expert_bias: bool = False
    bias_update_rate: float = Field(default=1e-3, ge=0)

    # Auxiliary losses, returned in the aux dict already multiplied by their coefficients.
    aux_loss: Literal["none", "switch", "sequence"] = "none"
    aux_loss_coef: float = Field(default=0.01, ge=0)
    z_loss_coef: float = Field(default=0.0, ge=0)

    # None = dropless; otherwise each expert takes at most ceil(factor * tokens * top_k / n_experts) copies.
    capacity_factor: float | None = Field(default=None, gt=0)

    # "auto" uses torch grouped_mm where it can and a padded batched matmul otherwise.
    experts_impl: Literal["auto", "grouped_mm", "padded"] = "auto"

    @model_validator(mode="after")
    def _check(self) -> MoEConfig:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds n_experts ({self.n_experts})")
        if self.n_experts % self.n_groups:
            raise ValueError(f"n_experts ({self.n_experts}) must be divisible by n_groups ({self.n_groups})")
        if self.topk_groups > self.n_groups:
            raise ValueError(f"topk_groups ({self.topk_groups}) exceeds n_groups ({self.n_groups})")
        if self.top_k > self.topk_groups * (self.n_experts // self.n_groups):
            raise ValueError(
                f"top_k ({self.top_k}) exceeds the experts in the selected groups "
                f"({self.topk_groups} groups x {self.n_experts // self.n_groups} experts)"
            )
        if self.shared_expert_gate and self.n_shared_experts == 0:
            raise ValueError("shared_expert_gate needs n_shared_experts >= 1")
        return self

    @property
    def shared_dim(self) -> int:
        """Hidden width of the shared experts fused into one SwiGLU (n_shared x per-expert width)."""
        return self.n_shared_experts * (self.shared_ffn_dim or self.expert_ffn_dim)
