"""Write a generated date-conversion task: chat conversations to train on and held-out items to score.

Each item asks for a numeric date (ISO ``1960-01-20`` or day/month/year ``20/01/1960``) in words, and the one
right answer is ``January 20, 1960``. Train and held-out items never share a date, so the evaluation measures the
skill (reading the numbers, naming the month), not recall.

    python examples/sft_dates/make_data.py --output data/dates --train 2000 --eval 200
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
from pathlib import Path

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
PROMPTS = (
    "Write the date {date} in words, as Month D, YYYY.",
    "Convert {date} to the form Month D, YYYY.",
    "How is the date {date} written as Month D, YYYY?",
)


def item(day: dt.date, rng: random.Random) -> tuple[str, str]:
    numeric = day.isoformat() if rng.random() < 0.5 else f"{day.day:02d}/{day.month:02d}/{day.year} (day/month/year)"
    return rng.choice(PROMPTS).format(date=numeric), f"{MONTHS[day.month - 1]} {day.day}, {day.year}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="directory for train.jsonl and eval.jsonl")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--eval", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    first, span = dt.date(1900, 1, 1), (dt.date(2099, 12, 31) - dt.date(1900, 1, 1)).days
    days = [first + dt.timedelta(days=d) for d in rng.sample(range(span + 1), args.train + args.eval)]
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.jsonl", "w") as f:
        for day in days[: args.train]:
            prompt, answer = item(day, rng)
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"messages": messages}) + "\n")
    with open(out / "eval.jsonl", "w") as f:
        for day in days[args.train :]:
            prompt, answer = item(day, rng)
            f.write(json.dumps({"messages": [{"role": "user", "content": prompt}], "answer": answer}) + "\n")
    print(f"wrote {args.train} training conversations and {args.eval} held-out items to {out}")


if __name__ == "__main__":
    main()
