"""``longboat chat``: a greedy multi-turn conversation through piped stdin replies exactly as ``generate --chat``
replies to the same conversation from scratch, while prefilling only the new turn's tokens."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

from longboat.cli.main import main
from longboat.recipes.chat import ChatSession, ContextFull, run_chat
from longboat.recipes.generate import load_for_inference
from tests.conftest import REPO
from tests.recipes.conftest import QA, SYSTEM

QUESTIONS = [QA[0][0], QA[4][0], QA[2][0]]
SAMPLING = ["--temperature", "0", "--max-new-tokens", "12"]


def from_scratch(capsys, model, messages) -> str:
    assert main(["generate", str(model), "--messages", json.dumps(messages), *SAMPLING]) == 0
    return capsys.readouterr().out.removesuffix("\n")


@pytest.mark.slow
def test_piped_chat_reuses_the_cache_and_replies_as_generate(chat_export, capsys):
    stdin = "\n".join([*QUESTIONS, "/exit", "never sent"]) + "\n"
    proc = subprocess.run([sys.executable, "-m", "longboat", "chat", str(chat_export), "--system", SYSTEM, *SAMPLING],
                          input=stdin, capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr
    replies = proc.stdout.splitlines()
    assert len(replies) == len(QUESTIONS)
    stats = [tuple(map(int, m)) for m in re.findall(r"prefilled (\d+) tokens, reused (\d+) from the cache",
                                                    proc.stderr)]
    assert len(stats) == len(QUESTIONS)

    loaded = load_for_inference(chat_export)
    messages = [{"role": "system", "content": SYSTEM}]
    for question, reply, (prefilled, reused) in zip(QUESTIONS, replies, stats):
        messages.append({"role": "user", "content": question})
        assert reply == from_scratch(capsys, chat_export, messages)
        rendered = len(loaded.render_chat(messages))
        assert prefilled + reused == rendered
        messages.append({"role": "assistant", "content": reply})
    # After the first turn only the new turn is prefilled: the previous rendering was cached whole.
    assert stats[0][1] == 0 and all(reused > 0 and prefilled < 25 for prefilled, reused in stats[1:])


def test_commands_reset_and_system(chat_export, capsys):
    loaded = load_for_inference(chat_export)
    session = ChatSession(loaded, max_new_tokens=12, temperature=0.0)
    stdin = io.StringIO(f"{QUESTIONS[0]}\n/system {SYSTEM}\n{QUESTIONS[1]}\n/reset\n/bogus\n\n{QUESTIONS[1]}\n")
    out, err = io.StringIO(), io.StringIO()
    assert run_chat(session, stdin, out, err) == 0  # the end of input ends the chat
    first, with_system, after_reset = out.getvalue().splitlines()
    assert "[system message set]" in err.getvalue() and "[conversation reset]" in err.getvalue()
    assert "unknown command /bogus" in err.getvalue()
    # The new system message changed the start of the rendering: the cache was rolled back to the first difference.
    stats = [tuple(map(int, m)) for m in re.findall(r"prefilled (\d+) tokens, reused (\d+)", err.getvalue())]
    assert stats[1][1] < stats[0][0] and stats[2][1] == 0
    assert session.messages() == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[1]},
                                  {"role": "assistant", "content": after_reset}]
    assert first == from_scratch(capsys, chat_export, [{"role": "user", "content": QUESTIONS[0]}])
    assert with_system == from_scratch(capsys, chat_export, [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]},
        {"role": "assistant", "content": first}, {"role": "user", "content": QUESTIONS[1]}])
    assert after_reset == from_scratch(capsys, chat_export, [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[1]}])


def test_full_context_says_so(chat_export):
    session = ChatSession(load_for_inference(chat_export), max_new_tokens=12, temperature=0.0)
    with pytest.raises(ContextFull, match=r"needs \d+ tokens and the model holds 256; /reset to start over"):
        session.send("word " * 300)
    assert session.turns == []  # the turn that did not fit is not kept
    out, err = io.StringIO(), io.StringIO()
    run_chat(session, io.StringIO("word " * 300 + f"\n{QUESTIONS[0]}\n"), out, err)
    assert "[context full:" in err.getvalue() and len(out.getvalue().splitlines()) == 1


def test_chat_needs_a_chat_template(plain_hf_dir, capsys):
    assert main(["chat", str(plain_hf_dir)]) == 2
    assert "the model's tokenizer has no chat template" in capsys.readouterr().err


def test_input_that_is_not_utf8_is_skipped_with_a_note(chat_export):
    """Such bytes on stdin raised UnicodeDecodeError out of the chat; now the line is not sent, a note says so, and
    the conversation goes on."""
    session = ChatSession(load_for_inference(chat_export), max_new_tokens=4, temperature=0.0)
    stdin = io.TextIOWrapper(io.BytesIO(b"caf\xe9 \xff\n" + QUESTIONS[0].encode() + b"\n"), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    assert run_chat(session, stdin, out, err) == 0
    assert "[input line 1 is not UTF-8 text; not sent]" in err.getvalue()
    assert len(out.getvalue().splitlines()) == 1
    assert [m["content"] for m in session.messages() if m["role"] == "user"] == [QUESTIONS[0]]


def test_images_attached_to_turns_reply_as_a_full_forward_loop(vlm_export):
    """Two turns, each with its image: every reply equals greedy full forwards over the whole conversation, and the
    second turn prefills only what follows the cached first (its image among it); a third, after the system message
    changed, prefills everything, both images again."""
    from tests.recipes.test_image_prompts import BLUE, RED, reference

    loaded = load_for_inference(vlm_export)
    session = ChatSession(loaded, max_new_tokens=4, temperature=0.0)
    messages, images = [], []
    for image, question in ((RED, "What colour is the shape?"), (BLUE, "And this one?")):
        session.attach(str(image))
        reply = session.send(question)
        messages.append({"role": "user", "content": "<image>" + question})
        images.append(image)
        text = loaded.tokenizer.decode(loaded.render_chat(messages))
        assert reply.text == loaded.tokenizer.decode(reference(loaded, text, images, 4))
        messages.append({"role": "assistant", "content": reply.text})
    assert reply.reused > 0 and reply.prefilled > 16  # the second image's 16 tokens were fed, not the first's
    assert session.pending == [] and len(session.images) == 2
    # A new system message changes all but the first token: both images are fed again with the whole conversation.
    session.system = "Be brief."
    reply = session.send("Which was first?")
    messages = [{"role": "system", "content": "Be brief."}, *messages, {"role": "user", "content": "Which was first?"}]
    text = loaded.tokenizer.decode(loaded.render_chat(messages))
    assert reply.reused <= 1 and reply.text == loaded.tokenizer.decode(reference(loaded, text, images, 4))


def test_image_command(vlm_export, tmp_path):
    from tests.recipes.test_image_prompts import RED

    session = ChatSession(load_for_inference(vlm_export), max_new_tokens=4, temperature=0.0)
    stdin = io.StringIO(f"/image {tmp_path / 'none.png'}\n/image {RED}\nWhat colour?\n<image>\n")
    out, err = io.StringIO(), io.StringIO()
    assert run_chat(session, stdin, out, err) == 0
    lines = err.getvalue().splitlines()
    assert lines[0] == f"[/image {tmp_path / 'none.png'}: missing image ({tmp_path / 'none.png'})]"
    assert lines[1] == f"[image {RED} attached to the next message]"
    assert lines[2].startswith("[prefilled ")
    # A placeholder typed without an image is refused, and the chat goes on.
    assert lines[3] == "[the conversation: 2 image tokens '<image>' for 1 images]"
    assert len(session.turns) == 2
