"""Text tokenizers: load and save Hugging Face tokenizer directories, train byte-level BPE.

Built on the ``tokenizers`` library alone; ``transformers`` reads what :meth:`Tokenizer.save` writes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from tokenizers import Tokenizer as _Backend
from tokenizers import decoders, models, pre_tokenizers, trainers

from longboat.data.text_sources import expand_inputs, iter_text_batches
from longboat.errors import LongboatError
from longboat.utils.json_files import read_json_object
from longboat.utils.outputs import check_output, staged_output

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# What a tokenizer directory holds that a copy of it (an export) must carry.
TOKENIZER_FILES = (TOKENIZER_FILE, CONFIG_FILE, SPECIAL_TOKENS_FILE, CHAT_TEMPLATE_FILE)
EOS_TOKEN = "<|endoftext|>"
# Used only when a directory names no eos token: the end-of-text markers of common tokenizers.
_EOS_FALLBACKS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
_SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


class TokenizerError(LongboatError, ValueError):
    """A tokenizer, or the text handed to it, is missing or not in the expected form."""


def _token_str(value: Any) -> str | None:
    """A special-token entry is a string, an AddedToken dict (``{"content": ...}``) or null."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus the special tokens and chat template of its HF directory."""

    def __init__(self, path: str | os.PathLike):
        """Load a directory holding ``tokenizer.json`` (and optionally its HF config files)."""
        path = Path(path)
        if not path.is_dir():
            raise TokenizerError(
                f"{path}: tokenizer directory not found (expected a directory holding {TOKENIZER_FILE})"
            )
        file = path / TOKENIZER_FILE
        if not file.is_file():
            raise TokenizerError(
                f"{path}: no {TOKENIZER_FILE} (only fast tokenizers are supported; convert a slow one by "
                f"loading it with transformers and calling save_pretrained)"
            )
        try:
            backend = _Backend.from_file(str(file))
        except Exception as e:  # the Rust side raises a bare Exception for malformed files
            raise TokenizerError(f"{file}: not a valid tokenizers file: {e}") from None
        config = read_json_object(path / CONFIG_FILE, TokenizerError) if (path / CONFIG_FILE).is_file() else {}
        if (path / SPECIAL_TOKENS_FILE).is_file():
            # transformers lets special_tokens_map.json override tokenizer_config.json.
            special = read_json_object(path / SPECIAL_TOKENS_FILE, TokenizerError)
            config.update({k: v for k, v in special.items() if k in _SPECIAL_KEYS and v is not None})
        if (path / CHAT_TEMPLATE_FILE).is_file() and not config.get("chat_template"):
            config["chat_template"] = (path / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
        self._init(backend, config, source=str(path))

    @classmethod
    def from_backend(cls, backend: _Backend, config: dict | None = None) -> "Tokenizer":
        """Wrap an in-memory ``tokenizers.Tokenizer``; ``config`` uses tokenizer_config.json keys."""
        self = cls.__new__(cls)
        self._init(backend, dict(config or {}), source="<memory>")
        return self

    def _init(self, backend: _Backend, config: dict, source: str) -> None:
        self.backend = backend
        self.config = config
        self.source = source
        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0
        self.bos_token = _token_str(config.get("bos_token"))
        self.eos_token = _token_str(config.get("eos_token"))
        self.pad_token = _token_str(config.get("pad_token"))
        if self.eos_token is None:
            self.eos_token = next((t for t in _EOS_FALLBACKS if t in vocab), None)
        self.bos_id = self._id_of(self.bos_token, "bos_token")
        self.eos_id = self._id_of(self.eos_token, "eos_token")
        self.pad_id = self._id_of(self.pad_token, "pad_token")
        self.chat_template: str | None = config.get("chat_template")

    def _id_of(self, token: str | None, role: str) -> int | None:
        if token is None:
            return None
        i = self.backend.token_to_id(token)
        if i is None:
            raise TokenizerError(f"{self.source}: {role} {token!r} is not in the vocabulary")
        return i

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` runs the post-processor (e.g. a BOS)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        """Token ids of each text (the backend may use several threads)."""
        # encode_batch_fast (tokenizers >= 0.21) skips computing character offsets.
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        encodings = encode(list(texts), add_special_tokens=add_special_tokens)
        return [e.ids for e in encodings]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` + ``tokenizer_config.json`` so ``AutoTokenizer`` can load them."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / TOKENIZER_FILE))
        config = {k: v for k, v in self.config.items() if k not in ("added_tokens_decoder", "auto_map")}
        config.update(
            # PreTrainedTokenizerFast resolves in transformers 4 and 5 alike.
            tokenizer_class="PreTrainedTokenizerFast",
            added_tokens_decoder={
                str(i): {
                    "content": t.content,
                    "lstrip": t.lstrip,
                    "normalized": t.normalized,
                    "rstrip": t.rstrip,
                    "single_word": t.single_word,
                    "special": t.special,
                }
                for i, t in sorted(self.backend.get_added_tokens_decoder().items())
            },
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            pad_token=self.pad_token,
        )
        # transformers 4 defaults to "cleaning" spaces in decode, which would break round trips.
        config.setdefault("clean_up_tokenization_spaces", False)
        if self.chat_template:
            config["chat_template"] = self.chat_template
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", "utf-8")
        return directory

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def train_bpe(
    files: Sequence[str | os.PathLike],
    vocab_size: int,
    out_dir: str | os.PathLike,
    min_frequency: int = 2,
    special_tokens: Sequence[str] = (EOS_TOKEN,),
    text_key: str = "text",
    txt_mode: str = "file",
    show_progress: bool = True,
    overwrite: bool = False,
) -> Tokenizer:
    """Train a byte-level BPE on text/jsonl/parquet files (globs allowed) and save it to ``out_dir``.

    Byte-level means every string survives ``decode(encode(x)) == x``; ``<|endoftext|>`` is the eos. A
    non-empty ``out_dir`` is replaced, once training is done, only with ``overwrite``, and never one that
    holds an input.
    """
    special_tokens = list(dict.fromkeys([EOS_TOKEN, *special_tokens]))
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(special_tokens):
        raise TokenizerError(
            f"vocab_size {vocab_size} is too small: byte-level BPE needs at least "
            f"{len(alphabet)} byte tokens + {len(special_tokens)} special tokens"
        )
    paths = expand_inputs(files)
    check_output(out_dir, overwrite, paths)  # before training, which may take long
    backend = _Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special_tokens,
        initial_alphabet=alphabet,
        # The trainer's bars write stray newlines to stdout when it is not a terminal.
        show_progress=show_progress and sys.stdout.isatty(),
    )
    chars = 0

    def batches():
        nonlocal chars
        for batch in iter_text_batches(paths, text_key=text_key, txt_mode=txt_mode):
            chars += sum(map(len, batch))
            yield batch

    backend.train_from_iterator(batches(), trainer)
    if chars == 0:
        names = ", ".join(map(str, paths[:3])) + (f" and {len(paths) - 3} more files" if len(paths) > 3 else "")
        raise TokenizerError(f"no text to train a tokenizer on in {names}; nothing was written to {out_dir}")
    tok = Tokenizer.from_backend(backend, {"eos_token": EOS_TOKEN, "bos_token": EOS_TOKEN})
    with staged_output(out_dir, overwrite, paths) as stage:
        tok.save(stage)
    return Tokenizer(out_dir)
