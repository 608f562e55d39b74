"""Router auxiliary losses: Switch load balancing, DeepSeek-V3 sequence-wise balance, ST-MoE z-loss."""

from __future__ import annotations

from torch import Tensor


def token_fractions(scores: Tensor, score_func: str) -> Tensor:
    """Per-token expert probabilities [..., E]: softmax output as is, sigmoid scores normalised to sum 1."""
    if score_func == "softmax":
        return scores
    return scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)


def switch_balance_loss(probs: Tensor, load: Tensor) -> Tensor:
    """E * sum_i f_i * P_i (Switch Transformer; transformers' `load_balancing_loss_func`).

    probs [N, E] per-token probabilities; load [E] routed token copies per expert.
    f_i = load_i / N (sums to top_k, as in transformers), P_i = mean over tokens of probs[:, i].
    """
    n_tokens, n_experts = probs.shape
    return n_experts * (load.to(probs.dtype) / n_tokens * probs.mean(dim=0)).sum()


def sequence_balance_loss(probs: Tensor, indices: Tensor, n_experts: int) -> Tensor:
    """DeepSeek-V3 complementary sequence-wise balance loss, averaged over sequences.

    probs [B, T, E] normalised per-token scores; indices [B, T, k] chosen experts. Per sequence:
    f_i = E / (k T) * #{t : i chosen at t}, P_i = mean_t probs[t, i], loss = sum_i f_i P_i.
    """
    batch, seq_len, top_k = indices.shape
    flat = indices.reshape(batch, seq_len * top_k)
    chosen = probs.new_zeros(batch, n_experts).scatter_add_(1, flat, probs.new_ones(flat.shape))
    f = chosen * (n_experts / (top_k * seq_len))
    p = probs.mean(dim=1)
    return (f * p).sum(dim=1).mean()


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE z-loss: mean over tokens of logsumexp(logits)^2; keeps router logits small."""
    return logits.logsumexp(dim=-1).square().mean()
