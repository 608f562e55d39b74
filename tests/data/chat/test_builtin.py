"""Built-in chat templates for tokenizers without one: chatml and llama3 by name, supervising each reply and its end
of turn; a tokenizer without a template, and an unknown name, are refused naming the choices."""

import pytest

from longboat.data.chat.builtin import resolve_chat_template
from longboat.data.chat.template import ChatTemplateError
from longboat.data.labels import IGNORE_INDEX
from longboat.data.tokenizer import Tokenizer
from tests.data.chat.conftest import CONVERSATIONS, encode, make_tokenizer


def test_builtin_templates(tmp_path):
    chatml = make_tokenizer(tmp_path / "plain", None, "<|endoftext|>", vocab_size=300)
    tok = Tokenizer(chatml)
    with pytest.raises(ChatTemplateError, match="no chat template; set data.chat_template to one of chatml, llama3"):
        resolve_chat_template(tok, None)
    for name, end in (("chatml", "<|im_end|>\n"), ("llama3", "<|eot_id|>")):
        template, own = resolve_chat_template(tok, name)
        assert not own
        [[sample]], _ = encode(chatml, [CONVERSATIONS[0]], chat_template=name)
        supervised = tok.decode([t for t in sample.labels.tolist() if t != IGNORE_INDEX])
        assert supervised == "A long, narrow ship with oars and a sail." + end
    with pytest.raises(ChatTemplateError, match="neither a built-in template"):
        resolve_chat_template(tok, "vicuna")
