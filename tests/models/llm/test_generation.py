"""KV-cached generation: greedy parity (uncached and transformers), sampling filters, seeding, eos."""

from __future__ import annotations

import pytest
import torch

from longboat.models.llm.generation import filter_logits, generate, sample_next
from longboat.models.llm import Decoder, DecoderConfig
from tests.models.llm.hf_reference import from_hf_name, hf_architecture, hf_config_dict

CFG = dict(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=64)


def random_model(seed: int = 0, **overrides) -> Decoder:
    torch.manual_seed(seed)
    model = Decoder(DecoderConfig(**{**CFG, "init_std": 0.2, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.2)
    return model


def uncached_greedy(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    seq = prompt
    with torch.no_grad():
        for _ in range(n):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq


@pytest.mark.parametrize("overrides", [{}, {"qk_norm": True, "head_dim": 32, "tie_embeddings": True}])
def test_cached_greedy_equals_uncached_argmax(overrides):
    model = random_model(**overrides)
    prompt = torch.randint(0, 128, (3, 7), generator=torch.Generator().manual_seed(1))
    out = generate(model, prompt, max_new_tokens=20, temperature=0)
    assert out.shape == (3, 27) and torch.equal(out[:, :7], prompt)
    assert torch.equal(out, uncached_greedy(model, prompt, 20))
    assert len(set(out[0, 7:].tolist())) > 1  # not a degenerate repeat of one token


@pytest.mark.parametrize("overrides", [{}, {"qkv_bias": True}])
def test_greedy_equals_transformers_generate(overrides):
    transformers = pytest.importorskip("transformers")
    ours = random_model(seed=3, **overrides)
    cfg = ours.cfg
    arch = hf_architecture(cfg)
    hf_cfg = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**hf_config_dict(cfg))
    hf = getattr(transformers, arch)(hf_cfg).eval()
    # Give HF our weights, renaming through the HF -> ours name map.
    ours_state = ours.state_dict()
    hf.load_state_dict({k: ours_state[from_hf_name(k)] for k in hf.state_dict() if from_hf_name(k) in ours_state})
    prompt = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=16,
                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(ours, prompt, max_new_tokens=16, temperature=0), expected)


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    kept = torch.isfinite(filter_logits(logits, top_k=5))
    assert kept.sum(-1).tolist() == [5] * 4
    assert torch.equal(kept, torch.zeros_like(kept).scatter(-1, logits.topk(5).indices, True))
    draws = torch.stack([sample_next(logits, 1.0, top_k=5, generator=torch.Generator().manual_seed(s))
                         for s in range(200)])
    assert kept.gather(-1, draws.T).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.1, 0.05]])
    logits = probs.log()
    assert torch.isfinite(filter_logits(logits, top_p=0.75)).tolist() == [[True, False, True, False, False]]
    assert torch.isfinite(filter_logits(logits, top_p=0.79)).tolist() == [[True, False, True, False, False]]
    assert torch.isfinite(filter_logits(logits, top_p=0.81)).tolist() == [[True, False, True, True, False]]
    assert torch.isfinite(filter_logits(logits, top_p=0.1)).sum() == 1  # the top token always stays
    draws = {sample_next(logits, 1.0, top_p=0.75, generator=torch.Generator().manual_seed(s)).item()
             for s in range(100)}
    assert draws == {0, 2}


def test_seeded_sampling_is_reproducible():
    model = random_model()
    prompt = torch.randint(0, 128, (2, 4))
    runs = [generate(model, prompt, 12, temperature=1.0, top_k=50, top_p=0.95,
                     generator=torch.Generator().manual_seed(seed)) for seed in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


class CountingModel(torch.nn.Module):
    """Predicts (last token + 1) mod V; a stand-in showing generate needs only forward and make_cache."""

    vocab = 10

    def make_cache(self, batch: int, max_len: int):
        return None

    def forward(self, tokens, positions, cache):
        return torch.nn.functional.one_hot((tokens + 1) % self.vocab, self.vocab).float()


def test_eos_stops_and_pads_finished_rows():
    prompt = torch.tensor([[5], [1]])
    out = generate(CountingModel(), prompt, max_new_tokens=20, temperature=0, eos_id=8)
    # Row 0 reaches 8 after 3 steps and then holds it; row 1 reaches 8 after 7 steps, which ends decoding.
    assert out.tolist() == [[5, 6, 7, 8, 8, 8, 8, 8], [1, 2, 3, 4, 5, 6, 7, 8]]
    assert generate(CountingModel(), prompt, max_new_tokens=3, temperature=0).shape == (2, 4)


def test_invalid_sampling_arguments():
    logits = torch.zeros(1, 5)
    with pytest.raises(ValueError, match="top_k"):
        filter_logits(logits, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        filter_logits(logits, top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        sample_next(logits, temperature=-1.0)


@pytest.mark.parametrize("flags, message", [
    (["--top-p", "2"], "top_p must be in (0, 1], got 2.0"),
    (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
    (["--top-p", "nan"], "top_p must be in (0, 1], got nan"),
    (["--temperature", "-1"], "temperature must be 0 (greedy) or positive, got -1.0"),
    (["--temperature", "nan"], "temperature must be 0 (greedy) or positive, got nan"),
    (["--top-k", "0"], "top_k must be at least 1, got 0"),
    (["--max-new-tokens", "-3"], "max_new_tokens must be at least 1, got -3"),
    (["--max-new-tokens", "0"], "max_new_tokens must be at least 1, got 0"),
    (["--num-samples", "0"], "num_samples must be at least 1, got 0"),
])
def test_generate_refuses_sampling_flags_out_of_range(tmp_path, capsys, flags, message):
    from longboat.cli.main import main

    # Checked before the model is opened: the path need not exist for the flag to be named.
    assert main(["generate", str(tmp_path / "no-model"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: {message}" and "Traceback" not in err


def test_negative_max_new_tokens_is_refused():
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(CountingModel(), torch.tensor([[1]]), max_new_tokens=-1)
    assert generate(CountingModel(), torch.tensor([[1]]), max_new_tokens=0).tolist() == [[1]]


def test_any_stop_id_ends_a_row_and_eos_still_works():
    prompt = torch.tensor([[5], [1], [0]])
    out = generate(CountingModel(), prompt, max_new_tokens=20, temperature=0, stop_ids={3, 7})
    # Row 0 stops at 7, rows 1 and 2 at 3; a finished row repeats its stop token until the last row finishes.
    assert out.tolist() == [[5, 6, 7, 7], [1, 2, 3, 3], [0, 1, 2, 3]]
    both = generate(CountingModel(), prompt, max_new_tokens=20, temperature=0, eos_id=8, stop_ids=[2])
    assert both.tolist() == [[5, 6, 7, 8], [1, 2, 2, 2], [0, 1, 2, 2]]


def test_rewound_cache_recomputes_exactly():
    model = random_model()
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    edited = ids.clone()
    edited[0, 8:] = (edited[0, 8:] + 1) % 128
    cache = model.make_cache(1, 16)
    with torch.no_grad():
        model(ids, None, cache)
        cache.rewind(8)  # keep the common prefix, recompute the rest
        tail = model(edited[:, 8:], torch.arange(8, 12)[None], cache)
        assert cache.length == 12
        assert torch.allclose(tail, model(edited)[:, 8:], atol=1e-5)
    with pytest.raises(ValueError, match="cannot rewind a cache of 12 positions to 13"):
        cache.rewind(13)
