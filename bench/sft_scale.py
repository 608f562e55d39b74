"""SFT data at scale: time to the first training step and peak memory, encoding in memory vs the on-disk cache.

For each size, synthetic multi-turn conversations (deterministic: the same size gives the same file) are written as
jsonl and ``longboat train`` (task sft, the tiny config's model, one step) runs three times, each in a fresh
process: ``data.cache: false`` (every source tokenised in this process, every sample held in memory), the cache
cold (encoded by ``--workers`` processes into a fresh directory) and the cache warm (mapped). Reported: wall time
from process start to the end of the first step, and the peak RSS of the training process (the encoding workers,
reported apart, hold one chunk of rows at a time); the ratios are in-memory over cached.

    python bench/sft_scale.py --sizes 20000,100000
    python bench/sft_scale.py --sizes 1000000 --workers 8
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "sft" / "tiny.yaml"
TOKENIZER = REPO / "tests" / "fixtures" / "sft" / "tokenizer"
WORDS = ("the boat rows past a harbour under grey sky while gulls call and the crew sings of home sail oar tide "
         "wind north south east west rope knot deck hull keel mast anchor shore island fish net bread salt").split()


def conversation(rng: random.Random) -> dict:
    """One to three exchanges, 3 to ~60 words a turn, sometimes a system prompt."""
    messages = [{"role": "system", "content": "You are a ship's pilot."}] if rng.random() < 0.3 else []
    for _ in range(rng.randint(1, 3)):
        for role in ("user", "assistant"):
            n = min(60, max(3, int(rng.lognormvariate(2.5, 0.7))))
            messages.append({"role": role, "content": " ".join(rng.choice(WORDS) for _ in range(n))})
    return {"messages": messages}


def write_conversations(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            f.write(json.dumps(conversation(rng)) + "\n")
    return path


def child(args) -> None:
    """One training run of one step; prints its timings as JSON."""
    from longboat.recipes import train
    from longboat.recipes.config import load_run_config

    overrides = [f"run_dir={args.run_dir}", f"data.tokenizer={TOKENIZER}", f"data.sources=[{args.data}]",
                 "data.valid_fraction=0", f"data.cache={str(args.mode != 'memory').lower()}",
                 f"data.cache_dir={args.cache_dir}", f"data.workers={args.workers}", "train.steps=1",
                 "train.eval_every=0", "train.log_every=1", "train.tensorboard=false", "train.threads=1",
                 "checkpoint.every=1000000", "checkpoint.export=false"]
    train.run(load_run_config(CONFIG, overrides))
    print(json.dumps({"first_step_s": time.perf_counter() - args.started,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "workers_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def measure(mode: str, data: Path, cache_dir: Path, run_dir: Path, workers: int) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--data", str(data), "--cache-dir", str(cache_dir),
           "--run-dir", str(run_dir), "--workers", str(workers)]
    started = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{mode} run failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - started
    return result


def main() -> None:
    started = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="20000,100000", help="conversations per run, comma-separated")
    p.add_argument("--workers", type=int, default=2, help="data.workers: processes that build the cache")
    p.add_argument("--child", choices=["memory", "cold", "warm"], help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.mode, args.started = args.child, started
        return child(args)
    print(f"tiny sft model, {TOKENIZER.name} tokenizer, data.workers={args.workers}; one training step per run")
    print(f"{'conversations':>13} {'path':>10} {'first step s':>13} {'peak RSS MB':>12} {'workers RSS MB':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for n in (int(s) for s in args.sizes.split(",")):
            data = write_conversations(tmp / f"chat-{n}.jsonl", n)
            cache = tmp / f"cache-{n}"
            results = {mode: measure(mode, data, cache, tmp / f"run-{n}-{mode}", args.workers)
                       for mode in ("memory", "cold", "warm")}
            for mode, r in results.items():
                print(f"{n:>13} {mode:>10} {r['first_step_s']:>13.1f} {r['peak_rss_mb']:>12.0f} "
                      f"{r['workers_peak_rss_mb']:>15.0f}")
            m = results["memory"]
            for mode in ("cold", "warm"):
                r = results[mode]
                print(f"{'':>13} {'memory/' + mode:>10} {m['first_step_s'] / r['first_step_s']:>12.2f}× "
                      f"{m['peak_rss_mb'] / r['peak_rss_mb']:>11.2f}×")


if __name__ == "__main__":
    main()
