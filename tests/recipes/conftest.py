"""A tiny chat model: a byte-level BPE with ChatML special tokens and a 2-layer Llama taught a few short answers.

Its eos (``<|endoftext|>``) differs from its end-of-turn token (``<|im_end|>``), so stopping at the end of a turn
is proven to come from the chat template. Trained for a moment so that it ends its turns by itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, trainers

from longboat.data.chat import ChatTemplate
from longboat.data.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QA = [("What is 2+3?", "5"), ("What is 4+4?", "8"), ("Name a color.", "Blue"), ("Say hello.", "Hello there!"),
      ("Capital of France?", "Paris"), ("What is 9-2?", "7"), ("Opposite of hot?", "Cold"), ("Spell cat.", "c a t")]
SYSTEM = "You are terse."


def conversations() -> list[list[dict]]:
    """Each answer alone, and after a system message."""
    single = [[{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a in QA]
    return single + [[{"role": "system", "content": SYSTEM}, *c] for c in single]


def build_tokenizer(out: Path) -> Tokenizer:
    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    text = [f"{q} {a} user assistant system" for q, a in QA] * 4
    backend.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok = Tokenizer.from_backend(backend, {"eos_token": "<|endoftext|>", "chat_template": CHATML})
    tok.save(out)
    return Tokenizer(out)


@pytest.fixture(scope="session")
def chat_hf_dir(tmp_path_factory) -> Path:
    """A Hugging Face directory (safetensors, config.json, tokenizer with a chat template, generation config)."""
    out = tmp_path_factory.mktemp("chat_hf")
    tok = build_tokenizer(out)
    template = ChatTemplate.from_tokenizer(tok)
    seqs = [tok.encode(template.render(c)) for c in conversations()]
    config = transformers.LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=tok.eos_id,
        bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    T = max(map(len, seqs))
    ids = torch.tensor([s + [tok.eos_id] * (T - len(s)) for s in seqs])
    labels = torch.tensor([s + [-100] * (T - len(s)) for s in seqs])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only contend
    try:
        for _ in range(80):
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 0.4, loss.item()
    model.eval().save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def chat_export(chat_hf_dir, tmp_path_factory) -> Path:
    from longboat.recipes.convert import hf_to_longboat

    return hf_to_longboat(chat_hf_dir, tmp_path_factory.mktemp("chat_export") / "export")


@pytest.fixture(scope="session")
def plain_hf_dir(chat_hf_dir, tmp_path_factory) -> Path:
    """The same model whose tokenizer has no chat template."""
    out = tmp_path_factory.mktemp("plain_hf") / "model"
    shutil.copytree(chat_hf_dir, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


VLM_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"  # drawn shapes and a tokenizer with <image>


def save_vlm_export(out: Path, vision: dict) -> Path:
    """An export of a tiny random vision-language model over ``vision`` (an MLP projector, a 2-layer decoder) with
    the fixture's tokenizer, whose ``<image>`` is the model's image token. Its weights are scaled up so that its
    greedy choices are far from ties and its images change what it says."""
    from longboat.checkpoint.export import save_export
    from longboat.config.base import validate
    from longboat.models import get_model
    from longboat.tasks.pretrain import tokenizer_assets

    fields = {"vision": vision, "projector": {"kind": "mlp"},
              "language": {"arch": "decoder", "preset": "tiny", "vocab_size": 512, "d_model": 32, "n_layers": 2,
                           "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 64, "max_seq_len": 256},
              "image_token_id": 3}
    spec = get_model("vlm")
    cfg = validate(spec.config, fields, "test")
    torch.manual_seed(0)
    model = spec.build(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(10)
    return save_export(out, model, "vlm", cfg.model_dump(mode="json"), tokenizer_assets(VLM_FIXTURE / "tokenizer"),
                       {"task": "sft"})


@pytest.fixture(scope="session")
def vlm_export(tmp_path_factory) -> Path:
    """A ViT over 32-pixel images in 8-pixel patches: 16 tokens an image."""
    vision = {"arch": "vit", "image_size": 32, "patch_size": 8, "d_model": 32, "n_layers": 1, "n_heads": 2}
    return save_vlm_export(tmp_path_factory.mktemp("vlm") / "export", vision)


@pytest.fixture(scope="session")
def qwen_vlm_export(tmp_path_factory) -> Path:
    """Qwen2.5-VL's tower: images keep their aspect ratio, (h/8)·(w/8) tokens each."""
    vision = {"arch": "qwen2_5_vl_vision", "d_model": 32, "n_layers": 2, "n_heads": 2, "ffn_dim": 48, "out_dim": 40,
              "patch_size": 4, "window_size": 16, "full_attention_layers": [1], "min_pixels": 64,
              "max_pixels": 4096}
    return save_vlm_export(tmp_path_factory.mktemp("qwen_vlm") / "export", vision)
