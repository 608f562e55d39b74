"""Chat templates longboat ships, for tokenizers that come without one, and how ``data.chat_template`` is resolved.

``data.chat_template``: null (the tokenizer's own), the name of a built-in template, or a ``.jinja`` file. Plugins
add templates with :func:`register_chat_template`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from longboat.data.chat.template import ChatTemplate, ChatTemplateError
from longboat.data.tokenizer import Tokenizer
from longboat.utils.registry import Registry

_DIR = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class BuiltinTemplate:
    source: str
    tokens: tuple[str, ...]  # the special tokens it writes, which the tokenizer must hold as single tokens


_TEMPLATES: Registry[BuiltinTemplate] = Registry("chat template", "known", ChatTemplateError)


def register_chat_template(name: str, source: str, tokens: tuple[str, ...] = ()) -> None:
    """Add the built-in template ``name`` (Jinja ``source``, writing the special ``tokens``)."""
    template = BuiltinTemplate(source, tuple(tokens))
    if _TEMPLATES.get(name, None) == template:
        return  # the same template again (a plugin imported twice)
    _TEMPLATES.register(name, template, stacklevel=2)


def chat_template_names() -> list[str]:
    return _TEMPLATES.names()


register_chat_template("chatml", (_DIR / "chatml.jinja").read_text("utf-8"), ("<|im_start|>", "<|im_end|>"))
register_chat_template("llama3", (_DIR / "llama3.jinja").read_text("utf-8"),
                       ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"))


def resolve_chat_template(tokenizer: Tokenizer, choice: str | None) -> tuple[ChatTemplate, bool]:
    """``(template, own)``: the template ``choice`` names for ``tokenizer``; ``own`` when it is the tokenizer's."""
    if choice is None:
        if not tokenizer.chat_template:
            raise ChatTemplateError(f"data.tokenizer: {tokenizer.source} has no chat template; set "
                                    f"data.chat_template to one of {', '.join(chat_template_names())} or a .jinja file")
        return ChatTemplate.from_tokenizer(tokenizer), True
    special = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token, "pad_token": tokenizer.pad_token}
    if choice in _TEMPLATES:
        builtin = _TEMPLATES.get(choice)
        missing = [t for t in builtin.tokens if tokenizer.backend.token_to_id(t) is None]
        if missing:
            raise ChatTemplateError(f"data.chat_template: '{choice}' writes {', '.join(missing)}, which "
                                    f"{tokenizer.source} does not hold as tokens; add them as special tokens or "
                                    "choose a template written for this tokenizer")
        return ChatTemplate(builtin.source, special, name=f"data.chat_template '{choice}'"), False
    path = Path(choice)
    if path.suffix != ".jinja" or not path.is_file():
        raise ChatTemplateError(f"data.chat_template: '{choice}' is neither a built-in template "
                                f"({', '.join(chat_template_names())}) nor a .jinja file")
    return ChatTemplate(path.read_text("utf-8"), special, name=f"data.chat_template {path}"), False
