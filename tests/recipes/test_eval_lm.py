"""``longboat eval-lm``: multiple-choice log-likelihoods equal transformers' (lm-evaluation-harness's recipe),
exact-match answers equal transformers' greedy generate, batches change nothing, bad rows fail clearly."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from longboat.cli.main import main
from longboat.recipes.eval_lm import EvalLMConfig, normalize_answer, run_eval_lm
from longboat.utils.stats import wilson_interval
from tests.recipes.conftest import QA, SYSTEM

transformers = pytest.importorskip("transformers")

MC_ROWS = [
    {"context": "What is 2+3?", "choices": ["5", "7", "Paris"], "label": 0},
    {"context": "Capital of France? ", "choices": ["Cold", "Paris", "8"], "label": 1},  # trailing space moves on
    {"prompt": "Opposite of hot?", "choices": ["Cold", "Blue", "Hello there!", "c a t"], "label": 0},
    {"context": "Name a color.", "choices": ["Blue", "7"], "label": 0},
    {"context": "", "choices": ["Blue", "What is"], "label": 1},  # no context: scored after the eos
]
EM_ROWS = [{"prompt": q, "answer": a} for q, a in QA[:6]] + [
    {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QA[6][0]}], "answer": QA[6][1]},
    {"prompt": QA[7][0], "answer": ["nope", QA[7][1]]},
]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def hf(chat_hf_dir):
    return (transformers.AutoModelForCausalLM.from_pretrained(chat_hf_dir).eval(),
            transformers.AutoTokenizer.from_pretrained(chat_hf_dir))


def reference_loglikelihood(hf, context: str, continuation: str) -> float:
    """lm-evaluation-harness's recipe, on transformers: the context's trailing whitespace joins the continuation,
    whose tokens are those of the whole text past the context's."""
    model, tok = hf
    moved = context[len(context.rstrip()):]
    context, continuation = context.rstrip(), moved + continuation
    ctx = tok(context, add_special_tokens=False).input_ids or [tok.eos_token_id]
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    ids = (ctx if not context else []) + whole
    start = len(ctx)
    with torch.no_grad():
        logprobs = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    return sum(logprobs[t - 1, ids[t]].item() for t in range(start, len(ids)))


@pytest.mark.slow
def test_multiple_choice_equals_transformers(chat_hf_dir, chat_export, hf, tmp_path):
    data = write_jsonl(tmp_path / "mc.jsonl", MC_ROWS)
    results = run_eval_lm(chat_export, EvalLMConfig(data=data, batch_size=3, output=tmp_path / "out" / "r.json"))
    assert results["kind"] == "multiple_choice" and results["n"] == len(MC_ROWS) and not results["chat"]
    acc = acc_norm = 0
    for row, item in zip(MC_ROWS, results["items"]):
        context = row.get("context", row.get("prompt"))
        expected = [reference_loglikelihood(hf, context, " " + c) for c in row["choices"]]
        assert item["logprobs"] == pytest.approx(expected, abs=1e-4, rel=0)
        normed = [ll / len(c.encode()) for ll, c in zip(expected, row["choices"])]
        acc += expected.index(max(expected)) == row["label"]
        acc_norm += normed.index(max(normed)) == row["label"]
    metrics = results["metrics"]
    assert metrics["acc"]["value"] == acc / len(MC_ROWS) and metrics["acc_norm"]["value"] == acc_norm / len(MC_ROWS)
    assert metrics["acc"]["ci95"] == pytest.approx(list(wilson_interval(acc, len(MC_ROWS))))
    assert json.loads((tmp_path / "out" / "r.json").read_text())["items"] == results["items"]

    # One sequence per batch, and the HF directory itself: the same scores (sums of ~40 nats, whose last bits
    # follow the batch's matmul shapes on some CPUs).
    alone = run_eval_lm(chat_hf_dir, EvalLMConfig(data=data, batch_size=1))
    for a, b in zip(alone["items"], results["items"]):
        assert a["logprobs"] == pytest.approx(b["logprobs"], abs=5e-5, rel=0)


@pytest.mark.slow
def test_multiple_choice_in_chat_scores_the_reply(chat_export, hf, tmp_path):
    rows = [{"context": q, "choices": [a, "Blue" if a != "Blue" else "Cold"], "label": 0} for q, a in QA]
    results = run_eval_lm(chat_export, EvalLMConfig(data=write_jsonl(tmp_path / "mc.jsonl", rows), chat=True))
    model, tok = hf
    for row, item in zip(rows, results["items"]):
        prompt = list(tok.apply_chat_template([{"role": "user", "content": row["context"]}],
                                              add_generation_prompt=True, tokenize=True, return_dict=False))
        expected = []
        for choice in row["choices"]:
            ids = prompt + tok(choice, add_special_tokens=False).input_ids
            with torch.no_grad():
                logprobs = model(torch.tensor([ids])).logits[0].log_softmax(-1)
            expected.append(sum(logprobs[t - 1, ids[t]].item() for t in range(len(prompt), len(ids))))
        assert item["logprobs"] == pytest.approx(expected, abs=1e-4, rel=0)
    assert results["metrics"]["acc"]["value"] >= 0.75  # the model was taught these answers


def transformers_greedy(hf, ids: list[int], max_new_tokens: int) -> str:
    model, tok = hf
    prompt = torch.tensor([ids])
    stops = [tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id]
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=stops, pad_token_id=0)[0, len(ids):].tolist()
    return tok.decode(out[:next((i for i, t in enumerate(out) if t in stops), len(out))])


@pytest.mark.slow
def test_exact_match_equals_transformers_greedy(chat_export, hf, tmp_path, capsys):
    data = write_jsonl(tmp_path / "em.jsonl", EM_ROWS)
    out = tmp_path / "em.json"
    assert main(["eval-lm", str(chat_export), "--data", data, "--batch-size", "4", "--max-new-tokens", "10",
                 "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["kind"] == "exact_match" and results["chat"]  # the model has a chat template
    _, tok = hf
    correct = 0
    for row, item in zip(EM_ROWS, results["items"]):
        messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
        ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        assert item["prediction"] == transformers_greedy(hf, ids, 10)
        answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
        correct += item["prediction"].strip() in answers
        assert item["exact_match"] == (item["prediction"].strip() in answers)
    assert correct >= 5  # the model was taught these answers
    n = len(EM_ROWS)
    low, high = wilson_interval(correct, n)
    assert f"exact_match  {correct / n:.4f}  (95% CI {low:.4f}–{high:.4f}, n={n})" in printed
    assert "tokens/s" in printed

    # Batches group prompts of equal token length, so batching changes no answer.
    alone = run_eval_lm(chat_export, EvalLMConfig(data=data, batch_size=1, max_new_tokens=10))
    assert [i["prediction"] for i in alone["items"]] == [i["prediction"] for i in results["items"]]
    limited = run_eval_lm(chat_export, EvalLMConfig(data=data, limit=3, max_new_tokens=10))
    assert limited["n"] == 3 and limited["items"] == results["items"][:3]


def test_exact_match_without_chat_continues_the_text(chat_export, hf, tmp_path):
    rows = [{"prompt": "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n", "answer": "hello there"}]
    cfg = EvalLMConfig(data=write_jsonl(tmp_path / "em.jsonl", rows), chat=False, normalize="squad",
                       max_new_tokens=10)
    item = run_eval_lm(chat_export, cfg)["items"][0]
    _, tok = hf
    assert item["prediction"] == transformers_greedy(hf, tok(rows[0]["prompt"]).input_ids, 10)
    assert item["exact_match"] == (normalize_answer(item["prediction"], "squad") == "hello there")


def test_normalisation_and_wilson_interval():
    assert normalize_answer("  The Paris! \n", "strip") == "The Paris!"
    assert normalize_answer("  The  Paris,   an a-b! \n", "squad") == "paris ab"
    low, high = wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0


@pytest.mark.parametrize("lines, line_no, message", [
    (['{"prompt": "a", "answer": "b"}', "{not json"], 2, "not valid JSON"),
    (['{"prompt": "a", "answer": "b"}', '["a"]'], 2, "expected a JSON object, got list"),
    (['{"prompt": "a"}'], 1, "exact-match rows need 'prompt' or 'messages', and 'answer'"),
    (['{"prompt": "a", "messages": [], "answer": "b"}'], 1, "one of 'prompt' (a string) or 'messages'"),
    (['{"messages": [{"role": "user"}], "answer": "b"}'], 1, "'messages': message 0 must be an object"),
    (['{"context": "a", "choices": ["x", "y"], "label": 0}', '', '{"context": "a", "choices": ["x"], "label": 0}'],
     3, "'choices' must be a list of at least two non-empty strings"),
    (['{"context": "a", "choices": ["x", "y"], "label": 2}'], 1, "'label' must be an index into the 2 choices"),
    (['{"choices": ["x", "y"], "label": 0}'], 1, "multiple-choice rows need 'context' (or 'prompt')"),
    # Tracebacks before: UnicodeDecodeError, and RecursionError from json.loads
    ([b'{"prompt": "a", "answer": "b"}', b'{"prompt": "caf\xe9", "answer": "b"}'], 2, "not UTF-8 text (byte 0xe9"),
    (['{"prompt": "a", "answer": "b"}', "[" * 100_000], 2, "JSON nested too deeply to read"),
])
def test_bad_rows_fail_in_one_line(tmp_path, capsys, lines, line_no, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines) + b"\n")
    # Rows are read before the model: the model path is not even looked at.
    assert main(["eval-lm", str(tmp_path / "no-model"), "--data", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}:{line_no}: ") and message in err and len(err.splitlines()) == 1


def test_rows_longer_than_the_model_and_messages_without_chat(chat_export, tmp_path, capsys):
    path = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "x", "answer": "y"}, {"prompt": "word " * 300,
                                                                                  "answer": "y"}])
    assert main(["eval-lm", str(chat_export), "--data", path, "--no-chat"]) == 2
    assert f"{path}:2: needs" in capsys.readouterr().err
    path = write_jsonl(tmp_path / "msgs.jsonl", EM_ROWS[6:7])
    assert main(["eval-lm", str(chat_export), "--data", path, "--no-chat"]) == 2
    assert "rows with 'messages' need the chat template" in capsys.readouterr().err



def test_output_is_checked_before_the_model_is_read(tmp_path, capsys):
    """An existing file, the data file itself or a directory as --output: one line, before the model (here a
    path that does not exist) is looked at, and nothing is touched."""
    data = write_jsonl(tmp_path / "qa.jsonl", EM_ROWS[:1])
    before = (tmp_path / "qa.jsonl").read_text()
    (tmp_path / "old.json").write_text("old")
    (tmp_path / "dir").mkdir()
    for output, extra, message in [
        ("old.json", [], "old.json already exists; pass --overwrite to replace it"),
        ("qa.jsonl", ["--overwrite"], "qa.jsonl: is an input of this command"),
        ("dir", ["--overwrite"], "dir: is a directory; expected the path of a file to write"),
    ]:
        code = main(["eval-lm", str(tmp_path / "no-model"), "--data", data, "--output", str(tmp_path / output),
                     *extra])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith(f"error: {tmp_path}/{message}") and len(err.splitlines()) == 1, err
    assert (tmp_path / "old.json").read_text() == "old" and (tmp_path / "qa.jsonl").read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["dir", "old.json", "qa.jsonl"] and not os.listdir(tmp_path / "dir")


def test_overwrite_replaces_an_output_file(chat_export, tmp_path):
    data = write_jsonl(tmp_path / "qa.jsonl", EM_ROWS[:1])
    out = tmp_path / "qa.json"
    out.write_text("old")
    assert main(["eval-lm", str(chat_export), "--data", data, "--max-new-tokens", "2", "--output", str(out),
                 "--overwrite"]) == 0
    assert json.loads(out.read_text())["n"] == 1 and sorted(os.listdir(tmp_path)) == ["qa.json", "qa.jsonl"]


def test_scores_from_hidden_states_equal_the_full_logits(monkeypatch):
    """Choices scored from the hidden states at their positions, a few at a time, equal log_softmax over the whole
    [batch, length, vocabulary] logits."""
    from longboat.models.llm import DECODER
    from longboat.recipes import eval_lm

    cfg = DECODER.config(**{**DECODER.load_preset("tiny"), "vocab_size": 300, "d_model": 32, "n_layers": 2,
                            "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 64, "max_seq_len": 64})
    torch.manual_seed(0)
    model = DECODER.build(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    requests = []
    for _ in range(9):
        n = int(torch.randint(4, 40, (1,), generator=gen))
        ids = torch.randint(0, 300, (n,), generator=gen).tolist()
        requests.append((ids, int(torch.randint(1, n, (1,), generator=gen))))
    monkeypatch.setattr(eval_lm, "SCORED_TOKENS_PER_CHUNK", 7)  # several chunks per batch
    got = eval_lm.score_choices(model, requests, batch_size=4)
    with torch.no_grad():
        expected = []
        for ids, start in requests:
            logps = model(torch.tensor([ids]))[0].log_softmax(-1)
            expected.append(sum(logps[t - 1, ids[t]].item() for t in range(start, len(ids))))
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-4)


@pytest.fixture
def image_data(tmp_path):
    """The fixture's images beside a data file that names them relatively."""
    import shutil

    from tests.recipes.test_image_prompts import BLUE, RED

    (tmp_path / "images").mkdir()
    for image in (RED, BLUE):
        shutil.copy(image, tmp_path / "images" / image.name)
    return tmp_path, f"images/{RED.name}", f"images/{BLUE.name}"


def test_exact_match_rows_with_images(vlm_export, image_data):
    """Prompts with an ``images`` list and messages with image parts, batched with each other and with a text row:
    every answer equals greedy full forwards of that row alone."""
    from longboat.recipes.generate import load_for_inference
    from tests.recipes.test_image_prompts import reference

    root, red, blue = image_data
    question = "What colour is the shape?"
    rows = [{"prompt": question, "answer": "red", "images": [red]},
            {"prompt": question, "answer": "blue", "images": [blue]},  # same length: batched with the first
            {"messages": [{"role": "user", "content": [{"type": "image", "image": blue},
                                                       {"type": "text", "text": question}]}], "answer": "blue"},
            {"prompt": "<image> or <image>?", "answer": "x", "images": [blue, red]},
            {"prompt": question, "answer": "x"}]
    results = run_eval_lm(vlm_export, EvalLMConfig(data=write_jsonl(root / "rows.jsonl", rows), batch_size=4,
                                                   max_new_tokens=6))
    loaded = load_for_inference(vlm_export)
    assert results["chat"] is True
    for row, item, images in zip(rows, results["items"], [[red], [blue], [blue], [blue, red], []]):
        text = row.get("prompt", question)
        content = text if "<image>" in text else "<image>" * len(images) + text
        prompt = loaded.tokenizer.decode(loaded.render_chat([{"role": "user", "content": content}]))
        expected = reference(loaded, prompt, [root / p for p in images], 6)
        assert item["prediction"] == loaded.tokenizer.decode(expected)
    assert results["items"][0]["prediction"] != results["items"][1]["prediction"]


@torch.inference_mode()
def test_multiple_choice_rows_with_images(vlm_export, image_data):
    from longboat.data.chat.images import expand_images, image_ref
    from longboat.data.chat.supervision import Sample
    from longboat.recipes.generate import load_for_inference

    root, red, blue = image_data
    rows = [{"context": "<image>Colour:", "choices": ["red", "blue"], "label": 0, "images": [red]},
            {"context": "Colour:", "choices": ["red", "blue"], "label": 1, "images": [blue]},
            {"context": "Colour:", "choices": ["red", "blue"], "label": 1}]
    results = run_eval_lm(vlm_export, EvalLMConfig(data=write_jsonl(root / "mc.jsonl", rows), batch_size=3))
    loaded = load_for_inference(vlm_export)
    reader, tok = loaded.images.reader, loaded.tokenizer
    for row, item in zip(rows, results["items"]):
        paths = [root / p for p in row.get("images", [])]
        expected = []
        for choice in row["choices"]:
            context = row["context"] if "<image>" in row["context"] or not paths else "<image>" + row["context"]
            n_context = len(tok.encode(context))
            ids = np.asarray(tok.encode(context + " " + choice))
            sample = expand_images(Sample(ids, ids.copy()), [image_ref(p, reader.processor) for p in paths],
                                   reader.image_token_id)
            start = n_context + len(sample.tokens) - len(ids)
            extra = {}
            if paths:
                extra = {"images": reader.processor([str(p) for p in paths])["images"],
                         "image_slots": torch.tensor([[0, r.offset] for r in sample.images])}
            logits = loaded.model(torch.tensor([sample.tokens.tolist()]), **extra)[0].log_softmax(-1)
            target = torch.tensor(sample.tokens[start:].tolist())
            expected.append(float(logits[start - 1:-1].gather(-1, target[:, None]).sum()))
        assert item["logprobs"] == pytest.approx(expected, abs=1e-4)
    assert results["items"][0]["logprobs"] != pytest.approx(results["items"][2]["logprobs"], abs=1e-3)


def test_rows_with_images_fail_in_one_line(vlm_export, image_data, capsys, tmp_path):
    root, red, _ = image_data
    cases = [
        ({"prompt": "hi", "answer": "x", "images": ["images/none.png"]},
         f"rows.jsonl:1: image {root / 'images/none.png'}: missing image"),
        ({"prompt": "<image><image>", "answer": "x", "images": [red]}, "rows.jsonl:1: 2 placeholders '<image>' for 1 "
                                                                        "images"),
        ({"prompt": "hi", "answer": "x", "images": "a.png"}, "rows.jsonl:1: 'images' must be a list of paths"),
        ({"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}], "answer": "x"},
         "rows.jsonl:1: unknown content part"),
    ]
    for row, message in cases:
        data = write_jsonl(root / "rows.jsonl", [row])
        assert main(["eval-lm", str(vlm_export), "--data", data]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    # A missing image fails before the model is read.
    data = write_jsonl(root / "rows.jsonl", [cases[0][0]])
    assert main(["eval-lm", str(tmp_path / "no_model"), "--data", data]) == 2
    assert cases[0][1] in capsys.readouterr().err
