"""The SFT recipe's data: the generated task is well formed and its held-out dates are unseen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from longboat.data.chat.sources import read_conversations

ROOT = Path(__file__).resolve().parents[2]


def test_make_data_writes_disjoint_train_and_eval(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "examples/sft_dates/make_data.py"), "--output", str(tmp_path),
                    "--train", "300", "--eval", "50"], check=True, capture_output=True)
    conversations, report = read_conversations(str(tmp_path / "train.jsonl"))
    assert len(conversations) == 300 and not report.malformed
    evals = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert len(evals) == 50
    trained = {c.messages[-1]["content"] for c in conversations}
    assert all(row["messages"][-1]["role"] == "user" for row in evals)
    assert not trained & {row["answer"] for row in evals}  # every held-out date is new
