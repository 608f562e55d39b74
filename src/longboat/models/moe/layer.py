"""Mixture-of-experts feed-forward layer: route, dispatch sorted by expert, grouped SwiGLU, combine."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor, nn

from longboat.models.moe.config import MoEConfig
from longboat.models.moe.experts import GroupedExperts, SwiGLU
from longboat.models.moe.losses import router_z_loss, sequence_balance_loss, switch_balance_loss, token_fractions
from longboat.models.moe.permute import invert_permutation, permute_rows, sum_copies
from longboat.models.moe.router import Router, Routing


def count_per_expert(ids: Tensor, n: int) -> Tensor:
    """Histogram of integer ids in [0, n) without a host sync (unlike bincount on CUDA)."""
    return torch.zeros(n, dtype=torch.long, device=ids.device).scatter_add_(0, ids, torch.ones_like(ids))


class MoE(nn.Module):
    """Drop-in replacement for a decoder's dense feed-forward.

    forward(x [..., d_model]) -> (y [..., d_model], aux). aux["loss"] is the weighted auxiliary loss to
    add to the training loss; the other entries are unweighted losses and detached statistics. forward has no side
    effects, so activation checkpointing may recompute it and torch.compile trace it: a training caller passes
    aux["load"] of each forward to ``record_load``, outside any checkpointed or compiled region, for the
    aux-loss-free bias update.
    """

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = Router(cfg)
        self.experts = GroupedExperts(cfg.n_experts, cfg.d_model, cfg.expert_ffn_dim, cfg.experts_impl)
        self.shared_experts = SwiGLU(cfg.d_model, cfg.shared_dim) if cfg.n_shared_experts else None
        self.shared_gate = nn.Linear(cfg.d_model, 1, bias=False) if cfg.shared_expert_gate else None
        # Routed copies per expert since the last bias update, as record_load adds them; an integer
        # buffer, so casting the model to bf16 leaves the counts exact.
        self.register_buffer("load_since_update", torch.zeros(cfg.n_experts, dtype=torch.long), persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, out_std: float | None = None) -> None:
        """Normal(0, std) for router and input projections, Normal(0, out_std) for the down projections."""
        out_std = std if out_std is None else out_std
        self.router.init_weights(std)
        self.experts.init_weights(std, out_std)
        if self.shared_experts is not None:
            self.shared_experts.init_weights(std, out_std)
        if self.shared_gate is not None:
            nn.init.normal_(self.shared_gate.weight, std=std)
        self.load_since_update.zero_()

    def forward(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """x [B, T, d] (or [N, d], read as one sequence) -> same shape, plus the aux dict."""
        shape = x.shape
        tokens = x.reshape(-1, self.cfg.d_model)
        routing = self.router(tokens)
        out, load, kept = self._routed(tokens, routing)
        if self.shared_experts is not None:
            shared = self.shared_experts(tokens)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(tokens)) * shared
            out = out + shared
        n_seqs = math.prod(shape[:-2]) if x.dim() > 2 else 1
        return out.view(shape), self._aux(routing, load, kept, n_seqs)

    def capacity(self, n_tokens: int) -> int | None:
        """Most token copies one expert takes from a batch of n_tokens, or None when dropless."""
        cfg = self.cfg
        if cfg.capacity_factor is None:
            return None
        return math.ceil(cfg.capacity_factor * n_tokens * cfg.top_k / cfg.n_experts)

    def _routed(self, x: Tensor, routing: Routing) -> tuple[Tensor, Tensor, Tensor]:
        """Weighted sum of the chosen experts' outputs [N, d], routed copies per expert, kept copies per expert."""
        n_tokens, top_k = routing.indices.shape
        n_exp = self.cfg.n_experts
        expert = routing.indices.reshape(-1)  # copy c is token c // k, choice c % k
        load = count_per_expert(expert, n_exp)

        capacity = self.capacity(n_tokens)
        if capacity is not None:
            # An expert keeps its first `capacity` copies in token order; the rest get key E, which
            # sorts them after every group, where the experts skip them.
            starts = load.cumsum(0) - load
            # rank: how many earlier copies went to the same expert (a stable sort keeps token order).
            rank = invert_permutation(torch.argsort(expert, stable=True)) - starts[expert]
            expert = torch.where(rank < capacity, expert, n_exp)
        order = torch.argsort(expert, stable=True)
        inverse = invert_permutation(order)
        kept = count_per_expert(expert, n_exp + 1)[:n_exp]

        # Each copy's routing weight travels with it and scales its expert's hidden units.
        scale = permute_rows(routing.weights.reshape(-1, 1), order, inverse).view(-1)
        y = self.experts(permute_rows(x, order, inverse, top_k), kept, dropless=capacity is None, scale=scale)
        # Back to (token, choice) order, then a fixed-order fp32 sum over the k choices.
        return sum_copies(y, order, inverse, top_k), load, kept

    def _aux(self, routing: Routing, load: Tensor, kept: Tensor, n_seqs: int) -> dict[str, Tensor]:
        cfg = self.cfg
        aux: dict[str, Tensor] = {}
        total = routing.logits.new_zeros(())
        if cfg.aux_loss != "none":
            probs = token_fractions(routing.scores, cfg.score_func)
            if cfg.aux_loss == "switch":
                balance = switch_balance_loss(probs, load)
            else:
                n = probs.shape[0]
                balance = sequence_balance_loss(
                    probs.view(n_seqs, n // n_seqs, -1), routing.indices.view(n_seqs, n // n_seqs, -1), cfg.n_experts
                )
            aux["balance_loss"] = balance
            total = total + cfg.aux_loss_coef * balance
        if cfg.z_loss_coef > 0:
            aux["z_loss"] = router_z_loss(routing.logits)
            total = total + cfg.z_loss_coef * aux["z_loss"]
        aux["loss"] = total
        aux["load"] = load.float()
        aux["dropped"] = (load - kept).float()
        return aux

    @torch.no_grad()
    def record_load(self, load: Tensor) -> None:
        """Add the routed copies per expert of one training forward (its aux["load"]) to ``load_since_update``."""
        self.load_since_update += load.to(self.load_since_update.dtype)

    @torch.no_grad()
    def update_expert_bias(self, load: Tensor | None = None, group: dist.ProcessGroup | None = None) -> None:
        """DeepSeek-V3 aux-loss-free balancing: bias_i += rate * sign(mean(load) - load_i).

        Call after the optimizer step. `load` defaults to the copies counted since the last update;
        when torch.distributed is initialised it is summed over `group` (default: all ranks) first,
        so every rank applies the same update.
        """
        bias = self.router.expert_bias
        if bias is None:
            raise RuntimeError("update_expert_bias needs MoEConfig.use_expert_bias=True")
        load = (self.load_since_update if load is None else load).detach().float().clone()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(load, group=group)
        bias += self.cfg.bias_update_rate * torch.sign(load.mean() - load)
        self.load_since_update.zero_()
