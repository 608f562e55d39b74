"""Top-k token-to-expert router: softmax or sigmoid scores, group-limited selection, selection bias."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longboat.models.moe.config import MoEConfig


class Routing(NamedTuple):
    """The router's decision for N tokens (all float tensors are fp32)."""

    indices: Tensor  # [N, k] chosen experts, best first
    weights: Tensor  # [N, k] combine weights for the chosen experts
    scores: Tensor  # [N, E] softmax probabilities or sigmoid scores, without the selection bias
    logits: Tensor  # [N, E]


class Router(nn.Module):
    """Linear gate over d_model followed by top-k selection (Mixtral, Qwen-MoE, DeepSeek-V3 rules)."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.n_experts, cfg.d_model))
        # Not trained by the optimizer: moved by MoE.update_expert_bias. Persistent so resumes keep it.
        self.expert_bias: Tensor | None
        if cfg.use_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(cfg.n_experts, dtype=torch.float32))
        else:
            self.expert_bias = None

    def init_weights(self, std: float) -> None:
        nn.init.normal_(self.weight, std=std)
        if self.expert_bias is not None:
            self.expert_bias.zero_()

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Router:
        """Move and cast as usual, except that the selection bias stays fp32: bf16 would swallow 1e-3 updates."""
        bias = self.expert_bias
        super()._apply(fn, recurse)
        if bias is not None and self.expert_bias.dtype != torch.float32:
            self.expert_bias = self.expert_bias.float() if bias.is_meta else bias.to(self.expert_bias.device)
        return self

    def forward(self, x: Tensor) -> Routing:
        """Route tokens x [N, d_model]."""
        cfg = self.cfg
        if cfg.router_dtype == "float32":
            logits = F.linear(x.float(), self.weight.float())
        else:
            logits = F.linear(x, self.weight.to(x.dtype)).float()
        scores = logits.softmax(dim=-1) if cfg.score_func == "softmax" else logits.sigmoid()

        # The bias only steers which experts are chosen; the combine weights come from the raw scores.
        choice = scores if self.expert_bias is None else scores + self.expert_bias
        if cfg.n_groups > 1:
            choice = self._limit_to_top_groups(choice)
        indices = choice.topk(cfg.top_k, dim=-1).indices
        weights = scores.gather(1, indices)
        if cfg.norm_topk_prob:
            total = weights.sum(dim=-1, keepdim=True)
            weights = weights / (total + 1e-20 if cfg.topk_norm_min is None else total.clamp(min=cfg.topk_norm_min))
        weights = weights * cfg.routed_scaling_factor
        return Routing(indices, weights, scores, logits)

    def _limit_to_top_groups(self, choice: Tensor) -> Tensor:
        """Mask experts outside each token's best `topk_groups` groups (DeepSeek-V3 node-limited routing)."""
        cfg = self.cfg
        n = choice.shape[0]
        grouped = choice.view(n, cfg.n_groups, cfg.n_experts // cfg.n_groups)
        # V3 ranks a group by the sum of its two highest expert scores.
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
        top_groups = group_scores.topk(cfg.topk_groups, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top_groups, True)
        return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(n, cfg.n_experts)
