"""Preference pairs for the dates skill, from what the base model actually answers.

``prompts`` turns the generated training conversations (``examples/sft_dates/make_data.py``) into ``eval-lm`` rows,
so the base model answers every training prompt; ``pairs`` then writes one pair per prompt the base model gets
wrong: chosen = the date in words, rejected = the base model's own answer.

    python examples/dpo_dates/make_pairs.py prompts --data data/dpo-dates --limit 320
    longboat eval-lm runs/smollm2-135m-instruct --data data/dpo-dates/train_prompts.jsonl --output base.json
    python examples/dpo_dates/make_pairs.py pairs --data data/dpo-dates --answers base.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def write_prompts(data: Path, limit: int | None) -> None:
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()][:limit]
    with open(data / "train_prompts.jsonl", "w") as f:
        for row in rows:
            user, answer = row["messages"]
            f.write(json.dumps({"messages": [user], "answer": answer["content"]}) + "\n")
    print(f"wrote {len(rows)} prompts to {data / 'train_prompts.jsonl'}")


def write_pairs(data: Path, answers: Path) -> None:
    prompts = [json.loads(line) for line in (data / "train_prompts.jsonl").read_text().splitlines()]
    items = json.loads(answers.read_text())["items"]
    n = 0
    with open(data / "pairs.jsonl", "w") as f:
        for item in items:
            row = prompts[item["line"] - 1]
            rejected = item["prediction"].strip()
            if item["exact_match"] or not rejected:
                continue  # nothing to prefer against: the base model already answers right
            f.write(json.dumps({"prompt": row["messages"], "chosen": [{"role": "assistant", "content": row["answer"]}],
                                "rejected": [{"role": "assistant", "content": rejected}]}) + "\n")
            n += 1
    print(f"wrote {n} pairs to {data / 'pairs.jsonl'} ({len(items) - n} prompts the base model answers right)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prompts", "pairs"])
    parser.add_argument("--data", type=Path, required=True, help="the directory make_data.py wrote")
    parser.add_argument("--answers", type=Path, help="eval-lm's results on train_prompts.jsonl (pairs)")
    parser.add_argument("--limit", type=int, help="prompts: the first N training conversations only")
    args = parser.parse_args()
    if args.step == "prompts":
        write_prompts(args.data, args.limit)
    else:
        if args.answers is None:
            parser.error("pairs needs --answers")
        write_pairs(args.data, args.answers)


if __name__ == "__main__":
    main()
