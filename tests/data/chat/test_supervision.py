"""Ids and labels equal transformers' to the token: ids are ``apply_chat_template(tokenize=True)``, labels the tokens
each assistant turn adds beyond the generation prompt, computed here with ``apply_chat_template`` on the prefixes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longboat.data.chat.builtin import resolve_chat_template
from longboat.data.chat.sources import Conversation
from longboat.data.chat.supervision import ChatSupervisor, SupervisionError
from longboat.data.labels import IGNORE_INDEX
from longboat.data.tokenizer import Tokenizer
from tests.data.chat.conftest import CONVERSATIONS, TOOLS, encode

transformers = pytest.importorskip("transformers")


def reference(hf, messages, **kwargs) -> tuple[list[int], list[int]]:
    """(ids, labels) by the definition, with the token ids of every prefix a prefix of the full ids."""

    def ids(msgs, prompt=False):
        return list(hf.apply_chat_template(msgs, add_generation_prompt=prompt, tokenize=True, return_dict=False,
                                           **kwargs))

    full = ids(messages)
    labels = [IGNORE_INDEX] * len(full)
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            before, through = ids(messages[:i], prompt=True), ids(messages[: i + 1])
            assert full[: len(before)] == before and full[: len(through)] == through
            labels[len(before): len(through)] = full[len(before): len(through)]
    return full, labels


def assert_matches_transformers(tokenizer_dir, conversations, **kwargs):
    hf = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    out, stats = encode(tokenizer_dir, conversations, template_kwargs=kwargs)
    assert stats.boundary_merges == 0 and stats.per_turn == 0
    for messages, samples in zip(conversations, out):
        ids, labels = reference(hf, messages, **kwargs)
        assert len(samples) == 1
        assert samples[0].tokens.tolist() == ids[:-1]  # pre-shifted: labels[t] is the target of tokens[t]
        assert samples[0].labels.tolist() == labels[1:]


def test_qwen25_style_template_matches_transformers(qwen_tokenizer):
    assert_matches_transformers(qwen_tokenizer, CONVERSATIONS, tools=TOOLS)
    assert_matches_transformers(qwen_tokenizer, CONVERSATIONS)


def generated(n: int, seed: int = 0) -> list[list[dict]]:
    """Multi-turn conversations of words drawn from the fixtures' conversations, some with a system prompt."""
    import random

    rng = random.Random(seed)
    words = " ".join(m["content"] for c in CONVERSATIONS for m in c).split()
    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": "You answer like a sailor."}] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 3)):
            messages += [{"role": role, "content": " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))}
                         for role in ("user", "assistant")]
        out.append(messages)
    return out


@pytest.mark.parametrize("name", ["qwen_tokenizer", "llama_tokenizer"])
def test_generated_conversations_match_transformers(name, request):
    """Span boundaries found by bisecting a few tokens' offsets give the labels of the definition."""
    assert_matches_transformers(request.getfixturevalue(name), generated(40))


def test_llama3_style_template_matches_transformers(llama_tokenizer):
    assert_matches_transformers(llama_tokenizer, CONVERSATIONS)


def test_supervised_text_is_each_reply_and_its_end_of_turn(llama_tokenizer):
    tok = Tokenizer(llama_tokenizer)
    [[sample]], _ = encode(llama_tokenizer, [CONVERSATIONS[1]])
    supervised = tok.decode([t for t in sample.labels.tolist() if t != IGNORE_INDEX])
    assert supervised == ("Make a loop, up through the hole, round the tree, back down the hole.<|eot_id|>"
                          "Right over left, then left over right.\n\nPull both ends tight.<|eot_id|>")


def test_train_on_all_supervises_every_token(qwen_tokenizer):
    [[sample]], _ = encode(qwen_tokenizer, [CONVERSATIONS[1]], train_on="all")
    assert sample.labels.tolist() == sample.tokens.tolist()[1:] + [sample.labels.tolist()[-1]]
    assert (sample.labels != IGNORE_INDEX).all()


QWEN3_TURNS = [
    {"role": "user", "content": "Two plus two?"},
    {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\nFour."},
    {"role": "user", "content": "And three more?"},
    {"role": "assistant", "content": "<think>\nFour plus three.\n</think>\n\nSeven."},
]


def test_history_rewriting_template_gives_one_sample_per_turn(qwen3_tokenizer):
    hf = transformers.AutoTokenizer.from_pretrained(qwen3_tokenizer)
    [samples], stats = encode(qwen3_tokenizer, [QWEN3_TURNS])
    assert stats.per_turn == 1 and len(samples) == 2
    for turn, sample in zip((1, 3), samples):
        ids = hf.apply_chat_template(QWEN3_TURNS[: turn + 1], tokenize=True, return_dict=False)
        before = hf.apply_chat_template(QWEN3_TURNS[:turn], add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
        assert ids[: len(before)] == before
        only_this_turn = [IGNORE_INDEX] * len(before) + ids[len(before):]
        assert sample.tokens.tolist() == ids[:-1] and sample.labels.tolist() == only_this_turn[1:]
    first = Tokenizer(qwen3_tokenizer).decode([t for t in samples[0].labels.tolist() if t != IGNORE_INDEX])
    assert first == "<think>\nAdd them.\n</think>\n\nFour.<|im_end|>\n"  # the reasoning later turns drop


def test_history_rewriting_template_is_refused_under_error(qwen3_tokenizer):
    with pytest.raises(SupervisionError, match=r"test.jsonl: row 1: the chat template rewrites earlier turns"):
        encode(qwen3_tokenizer, [QWEN3_TURNS], history_rewrite="error")
    [samples], stats = encode(qwen3_tokenizer, [QWEN3_TURNS[:2]], history_rewrite="error")  # one turn: no rewrite
    assert len(samples) == 1 and stats.per_turn == 0


def test_template_kwargs_reach_the_template(qwen3_tokenizer):
    hf = transformers.AutoTokenizer.from_pretrained(qwen3_tokenizer)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    [[sample]], _ = encode(qwen3_tokenizer, [messages], template_kwargs={"enable_thinking": False})
    prompt = hf.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert prompt.endswith("<think>\n\n</think>\n\n")
    supervised = Tokenizer(qwen3_tokenizer).decode([t for t in sample.labels.tolist() if t != IGNORE_INDEX])
    assert supervised == "Hello.<|im_end|>\n"  # the empty think block is part of the prompt, not the reply


def test_bpe_merge_across_the_prompt_boundary_is_supervised_and_counted(qwen_tokenizer):
    # The reply opens with a newline: the split rule makes one piece of the prompt's "\n" and the reply's "\n".
    tok = Tokenizer(qwen_tokenizer)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\nHello."}]
    [[sample]], stats = encode(qwen_tokenizer, [messages])
    assert stats.boundary_merges == 1
    ids = sample.tokens.tolist() + [sample.labels.tolist()[-1]]
    supervised = [t for t in sample.labels.tolist() if t != IGNORE_INDEX]
    assert tok.decode(supervised) == "\n\nHello.<|im_end|>\n"  # the straddling "\n\n" token is supervised
    assert ids[-len(supervised):] == supervised


def test_template_refusal_is_reported_per_conversation(qwen_tokenizer, tmp_path):
    strict = tmp_path / "strict.jinja"
    strict.write_text("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}"
                      "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    out, stats = encode(qwen_tokenizer, CONVERSATIONS, chat_template=str(strict))
    assert [len(s) for s in out] == [1, 1, 0] and list(stats.rejected) == [2]
    assert "no tools here" in stats.rejected[2]


def test_conversation_whose_turn_the_generation_prompt_does_not_open_is_rejected(qwen3_tokenizer):
    # Thinking off: the prompt ends in an empty think block, but this reply carries reasoning.
    [samples], stats = encode(qwen3_tokenizer, [QWEN3_TURNS[:2]], template_kwargs={"enable_thinking": False})
    assert samples == [] and "generation prompt does not open assistant turn 1" in stats.rejected[0]


def test_merge_is_found_where_no_added_token_precedes_the_boundary(qwen_tokenizer, tmp_path):
    # Plain-text turns: the prompt ends in a space that the reply's first word takes into its token.
    plain = tmp_path / "plain.jinja"
    plain.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                     "{% if add_generation_prompt %}assistant: {% endif %}")
    tok = Tokenizer(qwen_tokenizer)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "the tide."}]
    [[sample]], stats = encode(qwen_tokenizer, [messages], chat_template=str(plain))
    assert stats.boundary_merges == 1
    supervised = tok.decode([t for t in sample.labels.tolist() if t != IGNORE_INDEX])
    assert supervised == " the tide.\n"  # " the" holds the prompt's space


PIECES = ["Hi", " hi", "hi ", "\n", "\nHi", "Hi\n", "\n\n", " ", "the tide", "<|im_end|>", "ok."]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PIECES), st.sampled_from(PIECES)), min_size=1, max_size=3),
       st.sampled_from(["qwen", "llama"]))
def test_windowed_verification_finds_exactly_the_prefixes_whose_ids_differ(request, turns, which):
    """Each prefix is tokenized from its last added token only; that must flag the same prefixes as tokenizing
    the whole prefix does."""
    tokenizer_dir = request.getfixturevalue(f"{which}_tokenizer")
    tok = Tokenizer(tokenizer_dir)
    messages = [m for user, reply in turns for m in ({"role": "user", "content": user},
                                                     {"role": "assistant", "content": reply})]
    template, _ = resolve_chat_template(tok, None)
    full = tok.encode(template.render(messages))
    expected = 0
    for i in range(1, len(messages), 2):
        for prefix in (template.render(messages[:i], add_generation_prompt=True), template.render(messages[: i + 1])):
            ids = tok.encode(prefix)
            expected += ids != full[: len(ids)]
    _, stats = encode(tokenizer_dir, [messages])
    assert stats.boundary_merges == expected


def test_a_conversations_own_tools_reach_the_template(qwen_tokenizer):
    hf = transformers.AutoTokenizer.from_pretrained(qwen_tokenizer)
    messages = CONVERSATIONS[2]
    tok = Tokenizer(qwen_tokenizer)
    template, _ = resolve_chat_template(tok, None)
    [[sample], [without]], _ = ChatSupervisor(tok, template).encode([Conversation(messages, 1, TOOLS),
                                                                     Conversation(messages, 2)])
    ids, labels = reference(hf, messages, tools=TOOLS)
    assert sample.tokens.tolist() == ids[:-1] and sample.labels.tolist() == labels[1:]
    assert "# Tools" in tok.decode(sample.tokens.tolist()) and "# Tools" not in tok.decode(without.tokens.tolist())
