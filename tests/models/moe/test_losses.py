"""MoE auxiliary losses: the switch loss equals transformers'; the sequence and z losses follow their papers."""

from __future__ import annotations

import torch

from longboat.models.moe import MoE, MoEConfig
from tests.models.moe.conftest import D, FFN, hf_modeling, randomize


def test_switch_loss_matches_transformers():
    ours = MoE(MoEConfig(d_model=D, n_experts=8, top_k=2, expert_ffn_dim=FFN, aux_loss="switch", aux_loss_coef=0.02))
    randomize(ours, router_std=1.0)
    x = torch.randn(3, 20, D)
    _, aux = ours(x)
    routing = ours.router(x.view(-1, D))
    expected = hf_modeling("qwen3_moe").load_balancing_loss_func((routing.logits,), 8, 2)
    torch.testing.assert_close(aux["balance_loss"], expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(aux["loss"], 0.02 * expected)
    expected_mixtral = hf_modeling("mixtral").load_balancing_loss_func((routing.logits,), 8, 2)
    torch.testing.assert_close(aux["balance_loss"], expected_mixtral, atol=1e-6, rtol=1e-6)


def test_sequence_loss_and_z_loss_follow_published_formulas():
    n_exp, top_k, batch, seq = 8, 3, 2, 10
    ours = MoE(MoEConfig(
        d_model=D, n_experts=n_exp, top_k=top_k, expert_ffn_dim=FFN, score_func="sigmoid",
        aux_loss="sequence", aux_loss_coef=1e-3, z_loss_coef=1e-2,
    ))
    randomize(ours)
    x = torch.randn(batch, seq, D)
    _, aux = ours(x)
    routing = ours.router(x.view(-1, D))
    scores = routing.scores.view(batch, seq, n_exp)
    chosen = routing.indices.view(batch, seq, top_k)

    # DeepSeek-V3 eqs. 17-20: s' = s / sum_j s_j;  f_i = E/(K T) * sum_t 1[i in top-k_t];  P_i = mean_t s'_i,t.
    per_seq = []
    for b in range(batch):
        norm = scores[b] / scores[b].sum(dim=-1, keepdim=True)
        total = 0.0
        for i in range(n_exp):
            f_i = n_exp / (top_k * seq) * sum(int(i in chosen[b, t].tolist()) for t in range(seq))
            p_i = norm[:, i].mean()
            total = total + f_i * p_i
        per_seq.append(total)
    expected_seq = torch.stack(per_seq).mean()
    torch.testing.assert_close(aux["balance_loss"], expected_seq, atol=1e-6, rtol=1e-6)

    # ST-MoE eq. 5: z = (1/N) sum_t (log sum_j exp(logit_tj))^2.
    logits = routing.logits
    expected_z = sum(torch.log(torch.exp(logits[t]).sum()) ** 2 for t in range(logits.shape[0])) / logits.shape[0]
    torch.testing.assert_close(aux["z_loss"], expected_z, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(aux["loss"], 1e-3 * expected_seq + 1e-2 * expected_z, atol=1e-6, rtol=1e-6)

    # Both losses train the router.
    aux["loss"].backward()
    assert ours.router.weight.grad.abs().sum() > 0
