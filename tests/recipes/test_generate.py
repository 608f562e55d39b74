"""``generate --chat`` on a Hugging Face directory and an export: the same text as transformers' chat template +
greedy generate, stop ids from eos, generation_config.json and the template's end of turn, clear refusals."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch

from longboat.cli.main import main
from longboat.recipes.generate import load_for_inference
from tests.recipes.conftest import QA, SYSTEM

transformers = pytest.importorskip("transformers")


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def transformers_reply(hf_dir, messages, max_new_tokens=20) -> tuple[str, bool]:
    """transformers' greedy reply to ``messages`` and whether it ended at the end-of-turn token."""
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    prompt = torch.tensor([list(ids)])
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=[end_of_turn, tok.eos_token_id], pad_token_id=0)
    new = out[0, prompt.shape[1]:].tolist()
    ended = bool(new) and new[-1] == end_of_turn
    return tok.decode(new[:-1] if ended or new[-1] == tok.eos_token_id else new), ended


def test_stop_ids_come_from_eos_generation_config_and_the_template(chat_hf_dir, tmp_path):
    loaded = load_for_inference(chat_hf_dir)  # a plain HF directory loads like an export
    tok = loaded.tokenizer
    end_of_turn = tok.backend.token_to_id("<|im_end|>")
    assert loaded.end_of_turn_id == end_of_turn != tok.eos_id
    assert loaded.stop_ids == {tok.eos_id, end_of_turn}
    gen = json.loads((chat_hf_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_id

    # generation_config.json may add stop ids of its own, as an int or a list.
    import shutil
    copy = tmp_path / "model"
    shutil.copytree(chat_hf_dir, copy)
    (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_id, 7]}))
    assert load_for_inference(copy).stop_ids == {tok.eos_id, end_of_turn, 7}
    (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(Exception, match="generation_config.json: eos_token_id must be a token id"):
        load_for_inference(copy)


@pytest.mark.slow
@pytest.mark.parametrize("system", [None, SYSTEM])
def test_generate_chat_equals_transformers(chat_hf_dir, chat_export, capsys, system):
    question = QA[0][0]
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    expected, ended = transformers_reply(chat_hf_dir, messages)
    assert ended and expected  # the model ends its turn by itself, at <|im_end|> (not its eos)
    flags = ["--chat", "--prompt", question, "--temperature", "0", "--max-new-tokens", "20"]
    flags += ["--system", system] if system else []
    for model in (chat_hf_dir, chat_export):
        code, out, err = run_cli(capsys, "generate", str(model), *flags)
        assert code == 0, err
        assert out == expected + "\n"  # the reply alone, without the prompt
    code, out, _ = run_cli(capsys, "generate", str(chat_export), "--messages", json.dumps(messages),
                           "--temperature", "0", "--max-new-tokens", "20")
    assert code == 0 and out == expected + "\n"


def test_messages_from_a_file(chat_hf_dir, chat_export, capsys, tmp_path):
    messages = [{"role": "user", "content": QA[2][0]}, {"role": "assistant", "content": QA[2][1]},
                {"role": "user", "content": QA[4][0]}]
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(messages))
    code, out, err = run_cli(capsys, "generate", str(chat_export), "--messages", str(path), "--temperature", "0",
                             "--max-new-tokens", "20")
    assert code == 0, err
    assert out == transformers_reply(chat_hf_dir, messages)[0] + "\n"


@pytest.mark.parametrize("flags, message", [
    (["--messages", "[{\"role\": \"user\"}]"], "--messages: message 0 must be an object with string 'role' and "
                                               "'content'"),
    (["--messages", "{not json"], "--messages: expected a JSON list of messages"),
    (["--messages", "[]", "--prompt", "hi"], "--messages holds the whole conversation; drop --prompt and --system"),
    (["--system", "be brief"], "--system needs --chat"),
])
def test_bad_chat_flags(chat_export, capsys, flags, message):
    code, out, err = run_cli(capsys, "generate", str(chat_export), *flags)
    assert code == 2 and out == ""
    assert err.strip().startswith(f"error: {message}") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content, message", [
    (b'[{"role": "user", "content": "caf\xe9"}]', ":1: expected a JSON list of messages or a file holding one (not UTF-8 "
                                                "text (byte 0xe9 at offset 33))"),
    (b"[" * 100_000, ": expected a JSON list of messages or a file holding one (JSON nested too deeply to read)"),
])
def test_a_messages_file_that_cannot_be_parsed_is_one_line(chat_export, capsys, tmp_path, content, message):
    """Tracebacks before: UnicodeDecodeError was caught, but json.loads' RecursionError was not."""
    path = tmp_path / "messages.json"
    path.write_bytes(content)
    code, out, err = run_cli(capsys, "generate", str(chat_export), "--messages", str(path))
    assert code == 2 and out == ""
    assert err.strip() == f"error: {path}{message}"
    code, _, err = run_cli(capsys, "generate", str(chat_export), "--messages", "[" * 100_000)
    assert code == 2 and err.strip() == "error: --messages: expected a JSON list of messages or a file holding one " \
                                        "(JSON nested too deeply to read)"


def test_no_chat_template_is_one_clear_line(plain_hf_dir, capsys):
    code, _, err = run_cli(capsys, "generate", str(plain_hf_dir), "--chat", "--prompt", "hi")
    assert code == 2
    assert err.strip() == f"error: {plain_hf_dir}: the model's tokenizer has no chat template, so it cannot chat; " \
                          f"use a plain prompt"
    code, out, _ = run_cli(capsys, "generate", str(plain_hf_dir), "--prompt", "What is", "--temperature", "0",
                           "--max-new-tokens", "4")
    assert code == 0 and out.startswith("What is")


def test_unknown_hf_model_type(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    code, _, err = run_cli(capsys, "generate", str(tmp_path))
    assert code == 2 and "model_type 'bert' is not supported" in err and str(tmp_path) in err


def test_a_broken_template_fails_chat_only(plain_hf_dir, tmp_path, capsys):
    broken = tmp_path / "model"
    shutil.copytree(plain_hf_dir, broken)
    (broken / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }")  # an unclosed tag
    code, _, err = run_cli(capsys, "generate", str(broken), "--chat", "--prompt", "hi")
    assert code == 2 and "chat_template: not a valid Jinja template" in err and len(err.strip().splitlines()) == 1
    code, out, _ = run_cli(capsys, "generate", str(broken), "--prompt", "What is", "--temperature", "0",
                           "--max-new-tokens", "4")
    assert code == 0 and out.startswith("What is")


@pytest.mark.timeout(60)
def test_a_template_that_never_ends_fails_in_bounded_time(plain_hf_dir, tmp_path, capsys):
    looping = tmp_path / "model"
    shutil.copytree(plain_hf_dir, looping)
    (looping / "chat_template.jinja").write_text(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}")
    start = time.monotonic()
    code, out, err = run_cli(capsys, "generate", str(looping), "--chat", "--prompt", "hi")
    assert code == 2 and out == "" and time.monotonic() - start < 30
    assert err.startswith("error: ") and "ran past its limit" in err and len(err.strip().splitlines()) == 1


def test_generation_stops_where_the_context_ends(plain_hf_dir):
    from longboat.config.base import ConfigError
    from longboat.recipes.generate import complete

    loaded = load_for_inference(plain_hf_dir)
    loaded.stop_ids = frozenset()  # nothing ends the text but the context
    max_len = loaded.model.cfg.max_seq_len
    ids = loaded.tokenizer.encode("the sea " * max_len)[: max_len - 3]
    text, _ = complete(loaded, ids, max_new_tokens=10_000, temperature=0)
    assert len(loaded.tokenizer.encode(text)) <= 3 and text
    with pytest.raises(ConfigError, match=rf"the prompt \({max_len} tokens\) leaves no room in the model's context"):
        complete(loaded, ids + [ids[0]] * 3, max_new_tokens=1, temperature=0)
