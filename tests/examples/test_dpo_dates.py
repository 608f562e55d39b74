"""The DPO recipe's pairs: every prompt the base model got wrong becomes a pair (chosen: the date in words, rejected:
the model's answer) that the preference task reads; prompts it got right make none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from longboat.data.chat.pairs import read_pairs

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> None:
    subprocess.run([sys.executable, *args], check=True, capture_output=True)


def test_pairs_come_from_the_base_models_wrong_answers(tmp_path):
    run(str(ROOT / "examples/sft_dates/make_data.py"), "--output", str(tmp_path), "--train", "40", "--eval", "5")
    run(str(ROOT / "examples/dpo_dates/make_pairs.py"), "prompts", "--data", str(tmp_path), "--limit", "30")
    prompts = [json.loads(line) for line in (tmp_path / "train_prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 30 and all(p["messages"][0]["role"] == "user" for p in prompts)
    # eval-lm's results, as the base model would give them: right on the first two prompts, wrong on the rest.
    items = [{"line": i + 1, "prediction": p["answer"] if i < 2 else f"{p['answer'][:3]} ...",
              "exact_match": i < 2} for i, p in enumerate(prompts)]
    (tmp_path / "answers.json").write_text(json.dumps({"items": items}))
    run(str(ROOT / "examples/dpo_dates/make_pairs.py"), "pairs", "--data", str(tmp_path), "--answers",
        str(tmp_path / "answers.json"))
    pairs, report = read_pairs(tmp_path / "pairs.jsonl")
    assert len(pairs) == 28 and not report.n_malformed
    first = json.loads((tmp_path / "pairs.jsonl").read_text().splitlines()[0])
    assert first["chosen"][0]["content"] == prompts[2]["answer"]
    assert first["rejected"][0]["content"] == f"{prompts[2]['answer'][:3]} ..."
