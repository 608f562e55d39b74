"""Chat data: conversations, their rendering with a model's chat template, and the tokens a turn supervises."""

from longboat.data.chat.template import ChatTemplate, ChatTemplateError

__all__ = ["ChatTemplate", "ChatTemplateError"]
