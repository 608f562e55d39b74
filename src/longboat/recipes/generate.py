"""``longboat generate``: sample text from an export, a run directory, one of its checkpoints or an HF directory.

Generation stops at any of the model's stop ids: the tokenizer's eos, the ``eos_token_id`` of a
``generation_config.json`` shipped with the model, and the end-of-turn token of its chat template.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from longboat.config.base import ConfigError
from longboat.data.chat import ChatTemplate, ChatTemplateError
from longboat.data.chat.images import images_of
from longboat.data.chat.sources import Malformed
from longboat.data.tokenizer import TOKENIZER_FILE, Tokenizer
from longboat.models.llm.generation import generate
from longboat.recipes.artifact import open_artifact
from longboat.recipes.image_prompts import ImageInputs, expand_prompt, image_inputs_of, model_inputs, read_images, \
    require_images, with_placeholders
from longboat.recipes.sampling import check_sampling
from longboat.utils.json_files import JSONTextError, loads, read_json_object

GENERATION_CONFIG = "generation_config.json"
# Written as an assistant turn to find what the template puts after a reply; no template writes it itself.
_PROBE = "longboat-end-of-turn-probe"


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    source: Path
    stop_ids: frozenset[int] = frozenset()
    chat_template: ChatTemplate | None = None
    end_of_turn_id: int | None = None
    generation_config: dict = field(default_factory=dict)
    chat_template_error: str | None = None  # why a template the tokenizer ships cannot be used
    images: ImageInputs | None = None  # a model that reads images: its reader and placeholder

    def require_chat_template(self) -> ChatTemplate:
        if self.chat_template_error is not None:
            raise ConfigError(self.chat_template_error)
        if self.chat_template is None:
            raise ConfigError(f"{self.source}: the model's tokenizer has no chat template, so it cannot chat; "
                              f"use a plain prompt")
        return self.chat_template

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Token ids of ``messages`` rendered with the chat template, ending with the assistant's generation prompt."""
        # The template writes the special tokens (a BOS among them) itself.
        return self.tokenizer.encode(self.require_chat_template().render(messages, add_generation_prompt=True))


def load_for_inference(path: str | Path) -> LoadedModel:
    """A language model, its tokenizer, chat template and stop ids from an export, a run, a checkpoint or an HF dir."""
    artifact = open_artifact(path)
    tok = Tokenizer(artifact.asset_file(TOKENIZER_FILE).parent)
    gen_file = artifact.assets.get(GENERATION_CONFIG)
    gen_config = read_generation_config(gen_file) if isinstance(gen_file, Path) else {}
    template, end_of_turn, template_error = None, None, None
    if tok.chat_template:
        try:  # a broken template fails chatting only, not plain prompts
            template = ChatTemplate.from_tokenizer(tok)
            end_of_turn = end_of_turn_token(template, tok)
        except ChatTemplateError as e:
            template, template_error = None, str(e)
    eos = gen_config.get("eos_token_id")
    stops = {tok.eos_id, end_of_turn, *(eos if isinstance(eos, list) else [eos])} - {None}
    return LoadedModel(artifact.model, tok, artifact.source, frozenset(stops), template, end_of_turn, gen_config,
                       template_error, image_inputs_of(artifact.model, tok))


def read_generation_config(path: Path) -> dict:
    """``generation_config.json``, its ``eos_token_id`` checked to be an id or a list of ids."""
    data = read_json_object(path, ConfigError)
    eos = data.get("eos_token_id")
    if not all(i is None or (type(i) is int and i >= 0) for i in (eos if isinstance(eos, list) else [eos])):
        raise ConfigError(f"{path}: eos_token_id must be a token id or a list of ids, got {eos!r}")
    return data


def end_of_turn_token(template: ChatTemplate, tok: Tokenizer) -> int | None:
    """The special token the template writes right after an assistant's reply (``<|im_end|>``, ``<|eot_id|>``...).

    Found by rendering a short exchange, not from a list of known names; None when no special token follows.
    """
    text = template.render([{"role": "user", "content": "Hello"}, {"role": "assistant", "content": _PROBE}])
    at = text.rfind(_PROBE)
    if at < 0:
        return None
    rest = text[at + len(_PROBE):].lstrip()
    special = {t.content: i for i, t in tok.backend.get_added_tokens_decoder().items() if t.special}
    token = max((t for t in special if rest.startswith(t)), key=len, default=None)
    return special[token] if token is not None else None


def check_messages(value: Any, where: str, parts: bool = False) -> list[dict[str, Any]]:
    """``value`` as a conversation: a non-empty list of objects with a string ``role`` and ``content`` (or, with
    ``parts``, a list of content parts: text and images)."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a non-empty JSON list of messages, got {type(value).__name__}")
    for i, m in enumerate(value):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not (
                isinstance(content, str) or parts and isinstance(content, list)):
            kind = "'content' (a string, or a list of content parts)" if parts else "'content'"
            raise ConfigError(f"{where}: message {i} must be an object with string 'role' and {kind}, got {m!r}")
    return value


def messages_file(arg: str) -> Path | None:
    """The file ``--messages`` names, or None when it is the JSON text itself."""
    path = Path(arg)
    return path if len(arg) < 4096 and not arg.lstrip().startswith("[") and path.is_file() else None


def parse_messages(arg: str) -> list[dict[str, Any]]:
    """``--messages``: a JSON file, or the JSON text itself; a message's content may be a list of parts (text, and
    images for a model that reads them: ``flatten_parts``)."""
    path = Path(arg)
    is_file = messages_file(arg) is not None
    where = str(path) if is_file else "--messages"
    try:
        value = loads(path.read_bytes() if is_file else arg)
    except OSError as e:
        raise ConfigError(f"{where}: unreadable ({e.strerror or e})") from None
    except JSONTextError as e:
        at = f"{where}:{e.line}" if is_file and e.line is not None else where
        raise ConfigError(f"{at}: expected a JSON list of messages or a file holding one ({e.reason})") from None
    return check_messages(value, where, parts=True)


def flatten_parts(loaded: LoadedModel, messages: list[dict[str, Any]], base: Path, where: str = "--messages"
                  ) -> tuple[list[dict[str, Any]], list[str]]:
    """Messages whose content parts (``{"type": "image", "image": path}``, paths relative to ``base``) became text
    with the model's placeholders, as the SFT data reads them, and the images' files in placeholder order."""
    if not any(isinstance(m["content"], list) for m in messages):
        return messages, []
    found = require_images(loaded)
    try:
        row, refs = images_of({"messages": messages}, found.placeholder, base, found.reader.processor)
    except Malformed as e:
        raise ConfigError(f"{where}: {e.reason} ({e.detail})") from None
    return row["messages"], [r.path for r in refs]


def generate_text(
    loaded: LoadedModel,
    prompt: str,
    max_new_tokens: int = 128,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    images: Sequence[str | Path] = (),
) -> tuple[str, float]:
    """The completion of ``prompt`` and the decode rate in tokens/s; ``images`` (files) fill the prompt's
    placeholders, or come before its text when it holds none."""
    tok = loaded.tokenizer
    if images:
        prompt = attach_images(loaded, prompt, len(images), "--prompt")
    ids = tok.encode(prompt) if prompt else []
    if not ids:
        ids = [tok.bos_id if tok.bos_id is not None else tok.eos_id]
    return complete(loaded, ids, max_new_tokens, temperature, top_k, top_p, seed, images)


def attach_images(loaded: LoadedModel, text: str, n_images: int, where: str) -> str:
    """``text`` with a placeholder for each of ``n_images`` images (the model's; an error for a text-only model)."""
    return with_placeholders(text, n_images, require_images(loaded).placeholder, where)


def generate_chat(
    loaded: LoadedModel,
    messages: Sequence[dict[str, Any]],
    max_new_tokens: int = 128,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    images: Sequence[str | Path] = (),
) -> tuple[str, float]:
    """The assistant's reply to ``messages`` (rendered with the model's chat template) and the decode rate;
    ``images`` (files) fill the messages' placeholders in order."""
    return complete(loaded, loaded.render_chat(messages), max_new_tokens, temperature, top_k, top_p, seed, images)


def complete(
    loaded: LoadedModel,
    ids: list[int],
    max_new_tokens: int = 128,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    images: Sequence[str | Path] = (),
) -> tuple[str, float]:
    """The text that follows token ids ``ids``, up to the first stop id, and the decode rate in tokens/s.

    ``images`` (files) take the places of the image tokens of ``ids``, expanded as in training; their pixels enter
    the prefill step.
    """
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    inputs = None
    if images or (loaded.images is not None and loaded.images.reader.image_token_id in ids):
        prompt = expand_prompt(loaded, ids, read_images(loaded, images))
        ids, inputs = prompt.ids, prompt.inputs
    max_len = loaded.model.cfg.max_seq_len
    if len(ids) >= max_len:
        raise ConfigError(f"the prompt ({len(ids)} tokens) leaves no room in the model's context (max_seq_len "
                          f"{max_len})")
    max_new_tokens = min(max_new_tokens, max_len - len(ids))  # stop where the context ends, as chat does
    device = next(loaded.model.parameters()).device
    prompt_t = torch.tensor([ids], dtype=torch.long, device=device)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    out = generate(loaded.model, prompt_t, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   stop_ids=loaded.stop_ids, generator=gen,
                   inputs=None if inputs is None else model_inputs(loaded.model, inputs, device))
    elapsed = time.perf_counter() - start
    new = until_stop(out[0, len(ids):].tolist(), loaded.stop_ids)
    return loaded.tokenizer.decode(new), len(new) / max(elapsed, 1e-9)


def until_stop(ids: list[int], stop_ids: frozenset[int]) -> list[int]:
    """``ids`` up to (without) the first stop id."""
    return next((ids[:i] for i, t in enumerate(ids) if t in stop_ids), ids)
