"""Preference losses against TRL's own code on fixed log-probabilities, and sequence log-probabilities of packed
pairs against a transformers model's."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import transformers
from trl.trainer import dpo_trainer as trl_dpo

from longboat.data.labels import IGNORE_INDEX
from longboat.models.llm.hf import load_hf_model
from longboat.tasks.preference_loss import PairLogps, pair_logps, preference_losses


def fixed_logps(n: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (2, n), generator=g)
    policy = -torch.rand(2, n, generator=g, dtype=torch.float64) * lengths * 2
    reference = -torch.rand(2, n, generator=g, dtype=torch.float64) * lengths * 2
    return PairLogps(torch.arange(n), policy[0], policy[1], lengths[0], lengths[1]), reference.T.contiguous()


def trl_dpo_loss(loss_type: str, beta: float, label_smoothing: float, policy: PairLogps,
                 reference: torch.Tensor) -> torch.Tensor:
    """TRL's ``DPOTrainer._compute_loss`` on the given log-probs: a stand-in model returns per-token log-probs that
    sum to them over completion masks of the given lengths."""
    n = len(policy.ids)
    lengths = torch.cat([policy.chosen_tokens, policy.rejected_tokens])
    width = int(lengths.max()) + 1
    completion = (torch.arange(width)[None, :] < lengths[:, None]).long()
    shifted = completion[:, 1:]
    per_token = torch.zeros(2 * n, width - 1, dtype=torch.float64)
    totals = torch.cat([policy.chosen, policy.rejected])
    per_token[:, 0] = totals  # the sum is what counts; all on one position
    outputs = SimpleNamespace(log_probs=per_token, entropy=torch.zeros_like(per_token),
                              mean_logits=torch.zeros_like(per_token), is_top1=torch.zeros_like(shifted, dtype=bool))
    inputs = {"input_ids": torch.zeros(2 * n, width, dtype=torch.long), "attention_mask": completion,
              "completion_mask": completion, "ref_chosen_logps": reference[:, 0], "ref_rejected_logps": reference[:, 1]}
    accelerator = SimpleNamespace(device=torch.device("cpu"), gather=lambda x: x, gather_for_metrics=lambda x: x)
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=accelerator, aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0],
        beta=beta, label_smoothing=label_smoothing, use_weighting=False, _metrics={"train": defaultdict(list)},
        _total_train_tokens=0, _tp_size=1,
    )
    return trl_dpo.DPOTrainer._compute_loss(trainer, lambda **kw: outputs, inputs, False)


@pytest.mark.parametrize("kind, trl_name, smoothing", [
    ("dpo", "sigmoid", 0.0), ("hinge", "hinge", 0.0), ("ipo", "ipo", 0.0), ("robust", "robust", 0.2),
])
def test_each_loss_equals_trls(kind, trl_name, smoothing):
    for seed in range(3):
        policy, reference = fixed_logps(seed=seed)
        ours, rewards = preference_losses(kind, 0.3, policy, reference, smoothing)
        theirs = trl_dpo_loss(trl_name, 0.3, smoothing, policy, reference)
        torch.testing.assert_close(ours.mean(), theirs, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(rewards["chosen"], 0.3 * (policy.chosen - reference[:, 0]))


def test_simpo_equals_trls_cpo_loss():
    from trl.experimental.cpo.cpo_trainer import CPOTrainer

    policy, _ = fixed_logps()
    ours, rewards = preference_losses("simpo", 2.0, policy, None, 0.1, simpo_gamma=0.7)
    trainer = SimpleNamespace(alpha=0.0, loss_type="simpo", simpo_gamma=0.7, beta=2.0, label_smoothing=0.1,
                              accelerator=SimpleNamespace(device=torch.device("cpu")))
    average = (policy.chosen / policy.chosen_tokens, policy.rejected / policy.rejected_tokens)
    theirs, chosen, rejected = CPOTrainer.cpo_loss(trainer, *average)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rewards["chosen"], chosen)
    torch.testing.assert_close(rewards["rejected"], rejected)


def test_packed_pair_logps_equal_a_transformers_models_per_sequence(tmp_path):
    from tests.models.llm.hf.test_io import make_hf

    hf_dir = tmp_path / "llama"
    make_hf("llama", dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                          rms_norm_eps=1e-6)).save_pretrained(hf_dir)
    ours = load_hf_model(hf_dir)[0].eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(3)
    # two pairs in one row: prompt + answer, each sequence a segment; answers supervised from `split` on
    sequences = [(torch.randint(0, 64, (n,), generator=g), split) for n, split in ((9, 5), (7, 5), (6, 2), (11, 3))]
    T = 40
    tokens = torch.zeros(1, T, dtype=torch.long)
    labels = torch.full((1, T), IGNORE_INDEX)
    positions, segments, pair_ids = (torch.zeros(1, T, dtype=torch.long) for _ in range(3))
    pair_ids -= 1
    at, expected = 0, []
    for k, (seq, split) in enumerate(sequences):
        n = len(seq)
        tokens[0, at:at + n] = seq
        labels[0, at + split - 1:at + n - 1] = seq[split:]  # labels[t] is the target of tokens[t]
        positions[0, at:at + n] = torch.arange(n)
        segments[0, at:at + n] = k + 1
        pair_ids[0, at:at + n] = k // 2
        at += n
        with torch.no_grad():
            logp = torch.log_softmax(theirs(seq[None]).logits[0].double(), -1)
        expected.append(sum(logp[t - 1, seq[t]] for t in range(split, n)))
    batch = {"labels": labels, "segments": segments, "pair_ids": pair_ids}
    with torch.no_grad():
        got = pair_logps(ours(tokens, positions=positions, segments=segments), batch)
    assert got.ids.tolist() == [0, 1] and got.chosen_tokens.tolist() == [4, 4]
    torch.testing.assert_close(got.chosen, torch.stack([expected[0], expected[2]]).float(), rtol=0, atol=1e-4)
    torch.testing.assert_close(got.rejected, torch.stack([expected[1], expected[3]]).float(), rtol=0, atol=1e-4)
