"""Chat data: conversations, their rendering with a model's chat template, and the tokens a turn supervises."""

from longboat.data.chat.builtin import chat_template_names, register_chat_template, resolve_chat_template
from longboat.data.chat.packing import ChatRows, best_fit_decreasing, pack, pad
from longboat.data.chat.sources import ChatDataError, Conversation, SourceReport, check_malformed, read_conversations
from longboat.data.chat.supervision import ChatSupervisor, Sample, SupervisionError
from longboat.data.chat.template import ChatTemplate, ChatTemplateError

__all__ = [
    "ChatDataError", "ChatRows", "ChatSupervisor", "ChatTemplate", "ChatTemplateError", "Conversation", "Sample",
    "SourceReport", "SupervisionError", "best_fit_decreasing", "chat_template_names", "check_malformed", "pack",
    "pad", "read_conversations", "register_chat_template", "resolve_chat_template",
]
