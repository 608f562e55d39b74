"""Render conversations with a tokenizer's Jinja ``chat_template``, as ``transformers`` does.

The environment matches ``apply_chat_template``'s: a sandbox (templates come from model repositories and are
untrusted), ``trim_blocks``/``lstrip_blocks``, loop controls, a ``tojson`` filter that does not escape HTML,
``raise_exception``, ``strftime_now``, and the ``{% generation %}`` block (rendered as its body). The tokenizer's
special tokens (``bos_token``, ``eos_token``, ...) are visible to the template, so the rendered text tokenized
without added special tokens gives the same ids as ``apply_chat_template(..., tokenize=True)``.

A template is code, so its render is bounded (``longboat.data.chat.bounds``): in time, in output, and in the size
of every value it builds; past a limit it fails with a ``ChatTemplateError`` instead of spinning or allocating.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Sequence

import jinja2
from jinja2.ext import Extension, loopcontrols

from longboat.data.chat.bounds import BoundedSandbox, TemplateLimitError, deadline, render_bounded
from longboat.errors import LongboatError

Message = dict[str, Any]


class ChatTemplateError(LongboatError, ValueError):
    """A chat template is missing, does not compile, or refuses a conversation."""


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}``: HF's marker of assistant text; here it renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = BoundedSandbox(filters={"tojson": _tojson}, trim_blocks=True, lstrip_blocks=True,
                         extensions=[_GenerationBlock, loopcontrols])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatTemplate:
    """A compiled chat template plus the special tokens it may refer to."""

    def __init__(self, source: str, special_tokens: dict[str, str | None] | None = None, name: str = "chat_template"):
        self.source = source
        self.name = name
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        try:
            self._template = _compile(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ChatTemplateError(f"{name}: not a valid Jinja template (line {e.lineno}: {e.message})") from None

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "ChatTemplate":
        """The template a ``longboat.data.tokenizer.Tokenizer`` directory ships."""
        if not tokenizer.chat_template:
            raise ChatTemplateError(f"{tokenizer.source}: the tokenizer has no chat_template")
        source = tokenizer.chat_template
        if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            if "default" not in named:
                raise ChatTemplateError(f"{tokenizer.source}: chat_template lists {sorted(named)} but no 'default'")
            source = named["default"]
        special = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token,
                   "pad_token": tokenizer.pad_token, "unk_token": _config_token(tokenizer.config, "unk_token")}
        return cls(source, special, name=f"{tokenizer.source}: chat_template")

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False,
               tools: list[dict] | None = None, documents: list[dict] | None = None, **kwargs: Any) -> str:
        """The conversation as the model sees it (extra ``kwargs`` such as ``enable_thinking`` reach the template)."""
        try:
            with deadline():
                return render_bounded(self._template.generate(
                    messages=list(messages), tools=tools, documents=documents,
                    add_generation_prompt=add_generation_prompt, **self.special_tokens, **kwargs,
                ))
        except (jinja2.exceptions.TemplateError, TemplateLimitError) as e:
            raise ChatTemplateError(f"{self.name}: {e}") from None
        except Exception as e:  # the template is code of its own: 1 / 0, 'a' + 1, a recursion too deep, ...
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ChatTemplateError(f"{self.name}: the render failed: {type(e).__name__}: {reason}") from None


def _config_token(config: dict, key: str) -> str | None:
    value = config.get(key)
    return value.get("content") if isinstance(value, dict) else value
