"""Conversations per second of SFT tokenization (ids and assistant labels) against transformers.

Ours: ``ChatSupervisor.encode``, the path the ``sft`` task runs: each conversation rendered in full and once per
assistant-turn boundary, batch-encoded with offsets, each prefix verified at the token level. Peers on the same
conversations, tokenizer and thread count: ``apply_chat_template(conversations, tokenize=True)`` (ids only, no
labels: a floor for the work), and labels by their definition with ``apply_chat_template`` on every prefix
(what a direct implementation does). CPU seconds (all threads) and wall seconds, medians over repeats.

    python -P bench/sft_tokenize.py --tokenizer path/to/SmolLM2-135M-Instruct [--conversations 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sysconfig
import time
from pathlib import Path

from longboat.data.chat import ChatSupervisor, Conversation, resolve_chat_template
from longboat.data.tokenizer import Tokenizer


def conversations(n: int, seed: int = 0) -> list[list[dict]]:
    """1-4 exchanges (half with a system turn) of standard-library text, 10-200 words a turn."""
    root = Path(sysconfig.get_paths()["stdlib"])
    words = " ".join(p.read_text(errors="replace") for p in sorted(root.glob("*.py"))[:20]).split()
    rng = random.Random(seed)

    def text(k: int) -> str:
        i = rng.randrange(len(words) - k)
        return " ".join(words[i:i + k])

    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": text(20)}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 4)):
            messages += [{"role": "user", "content": text(rng.randint(10, 80))},
                         {"role": "assistant", "content": text(rng.randint(20, 200))}]
        out.append(messages)
    return out


def timed(fn) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="HF tokenizer directory with a chat template")
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import transformers

    data = conversations(args.conversations)
    tok = Tokenizer(args.tokenizer)
    template, _ = resolve_chat_template(tok, None)
    supervisor = ChatSupervisor(tok, template)
    hf = transformers.AutoTokenizer.from_pretrained(args.tokenizer)

    def ours():
        return supervisor.encode([Conversation(m, i) for i, m in enumerate(data)])

    def hf_ids():
        return hf.apply_chat_template(data, tokenize=True, return_dict=False)

    def hf_labels():
        for messages in data:
            hf.apply_chat_template(messages, tokenize=True, return_dict=False)
            for i, m in enumerate(messages):
                if m["role"] == "assistant":
                    hf.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=True, return_dict=False)
                    hf.apply_chat_template(messages[: i + 1], tokenize=True, return_dict=False)

    out, _ = ours()
    tokens = sum(len(s) + 1 for samples in out for s in samples)
    print(f"{len(data)} conversations, {tokens} tokens, {args.tokenizer}")
    runs = {name: [] for name in ("longboat", "transformers ids only", "transformers labels by prefixes")}
    for _ in range(args.repeats):  # interleaved, so machine noise hits all three
        for name, fn in zip(runs, (ours, hf_ids, hf_labels)):
            runs[name].append(timed(fn))
    ours_cpu = statistics.median(c for c, _ in runs["longboat"])
    for name, times in runs.items():
        cpu, wall = statistics.median(c for c, _ in times), statistics.median(w for _, w in times)
        print(f"{name:32s} {len(data) / cpu:8.0f} conversations/s CPU ({tokens / cpu / 1e3:6.0f}k tokens/s) · "
              f"{len(data) / wall:8.0f}/s wall · {cpu / ours_cpu:5.2f}x longboat's CPU time")


if __name__ == "__main__":
    main()
