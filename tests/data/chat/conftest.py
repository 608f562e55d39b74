"""Small real tokenizers with chat templates (Qwen2.5-, Llama-3- and Qwen3-style) that ``transformers`` loads,
conversations with system prompts, several turns and tool calls, and ``encode`` (conversations through the chat
supervisor)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from longboat.data.chat.builtin import resolve_chat_template
from longboat.data.chat.sources import Conversation
from longboat.data.chat.supervision import ChatSupervisor
from longboat.data.tokenizer import Tokenizer as LongboatTokenizer

TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "chat"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>"]
# Llama 3's and Qwen2's pre-tokenizer split: newline runs are pieces of their own.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")

TOOLS = [{"type": "function", "function": {"name": "get_tide", "description": "High tide time at a harbour",
                                            "parameters": {"type": "object",
                                                           "properties": {"harbour": {"type": "string"}}}}}]
CONVERSATIONS = [
    [{"role": "user", "content": "What is a longboat?"},
     {"role": "assistant", "content": "A long, narrow ship with oars and a sail."}],
    [{"role": "system", "content": "You answer like a sailor."},
     {"role": "user", "content": "How do I tie a bowline?"},
     {"role": "assistant", "content": "Make a loop, up through the hole, round the tree, back down the hole."},
     {"role": "user", "content": "And a reef knot?"},
     {"role": "assistant", "content": "Right over left, then left over right.\n\nPull both ends tight."}],
    [{"role": "user", "content": "When is high tide in Bergen?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "get_tide", "arguments": {"harbour": "Bergen"}}}]},
     {"role": "tool", "content": "{\"time\": \"14:32\"}", "name": "get_tide"},
     {"role": "assistant", "content": "High tide in Bergen is at 14:32."},
     {"role": "user", "content": "Thanks!"},
     {"role": "assistant", "content": "Fair winds!"}],
]


def corpus() -> list[str]:
    lines = [m["content"] for c in CONVERSATIONS for m in c] + [TEMPLATES.joinpath("qwen25_style.jinja").read_text()]
    return lines * 5 + ["user assistant system tool ipython\n\n You are a helpful assistant."] * 20


def encode(tokenizer_dir, conversations, **options):
    """Conversations through the chat supervisor as a training run encodes them: (samples per conversation, stats)."""
    tok = LongboatTokenizer(tokenizer_dir)
    template, _ = resolve_chat_template(tok, options.pop("chat_template", None))
    supervisor = ChatSupervisor(tok, template, **options)
    return supervisor.encode([Conversation(m, i + 1) for i, m in enumerate(conversations)], "test.jsonl")


def make_tokenizer(out: Path, template: str | None, eos: str, bos: str | None = None, vocab_size: int = 600) -> Path:
    """A byte-level BPE with the chat special tokens, saved as a directory that ``AutoTokenizer`` loads."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus(), trainer)
    config = {"eos_token": eos, "bos_token": bos}
    if template is not None:
        config["chat_template"] = (TEMPLATES / template).read_text()
    LongboatTokenizer.from_backend(backend, config).save(out)
    return out


@pytest.fixture(scope="session")
def qwen_tokenizer(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("qwen"), "qwen25_style.jinja", "<|im_end|>")


@pytest.fixture(scope="session")
def llama_tokenizer(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("llama"), "llama3_style.jinja", "<|eot_id|>", "<|begin_of_text|>")


@pytest.fixture(scope="session")
def qwen3_tokenizer(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("qwen3"), "qwen3_style.jinja", "<|im_end|>")
