"""Multiple-choice scoring memory at a 150k vocabulary: ``longboat eval-lm``'s scorer against transformers.

Both score the same multiple-choice requests (context + each choice, the continuation's summed log-probability, as
lm-evaluation-harness defines it) with the same Hugging Face checkpoint: a 4-layer Qwen2 with Qwen's 151,936-token
vocabulary and random weights. Ours is ``eval-lm``'s own path (``load_for_inference`` + ``score_choices``: hidden
states at the continuation positions only, their logits a few hundred at a time); theirs is what the harness's HF
backend does: ``model(tokens).logits``, ``log_softmax`` over the whole batch, gather. Each side runs in a process of
its own; memory is the peak RSS while scoring above the RSS once the model is loaded. The scores are compared too.

    python bench/eval_lm_memory.py                  # about a minute
    python bench/eval_lm_memory.py --batch 32 --length 512
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

VOCAB = 151_936


def make_model(out: Path) -> None:
    import transformers

    config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(out)
    # A tokenizer directory so that longboat can open the checkpoint; the requests below are token ids already.
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "[UNK]"}))


def requests(n: int, length: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """``n`` requests of ``length`` tokens, the last quarter the continuation (a choice)."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (length,), generator=gen).tolist(), length - length // 4) for _ in range(n)]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ours(model_dir: Path, reqs, batch: int) -> list[float]:
    from longboat.recipes.eval_lm import score_choices
    from longboat.recipes.generate import load_for_inference

    model = load_for_inference(model_dir).model.eval()
    return score_choices(model, reqs, batch)


def theirs(model_dir: Path, reqs, batch: int) -> list[float]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    scores = [0.0] * len(reqs)
    with torch.inference_mode():
        for b in range(0, len(reqs), batch):
            chunk = reqs[b:b + batch]
            tokens = torch.tensor([ids for ids, _ in chunk])
            logps = model(tokens).logits.float().log_softmax(-1)
            for r, (ids, start) in enumerate(chunk):
                target = tokens[r, start:]
                scores[b + r] = logps[r, start - 1:-1].gather(-1, target[:, None]).sum().item()
    return scores


def side(name: str, model_dir: Path, args) -> None:
    """Run one side in this process; print its figures as JSON."""
    reqs = requests(args.requests, args.length)
    torch.set_num_threads(args.threads)
    fn = ours if name == "ours" else theirs
    fn(model_dir, reqs[:1], 1)  # load once, so the baseline below includes the model and its first-call buffers
    base = rss_mb()
    start = time.perf_counter()
    scores = fn(model_dir, reqs, args.batch)
    seconds = time.perf_counter() - start
    print(json.dumps({"scores": scores, "peak_mb": peak_mb(), "base_mb": base, "seconds": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--side", choices=["ours", "theirs"], help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        side(args.side, args.model, args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "qwen2"
        make_model(model_dir)
        got = {}
        for name in ("ours", "theirs"):
            out = subprocess.run([sys.executable, __file__, "--side", name, "--model", str(model_dir),
                                  *sum(([f"--{k}", str(getattr(args, k))] for k in
                                        ("requests", "batch", "length", "threads")), [])],
                                 capture_output=True, text=True, check=True)
            got[name] = json.loads(out.stdout.strip().splitlines()[-1])
    a, b = got["ours"], got["theirs"]
    diff = max(abs(x - y) for x, y in zip(a["scores"], b["scores"]))
    print(f"{args.requests} requests of {args.length} tokens, batch {args.batch}, vocabulary {VOCAB:,}, "
          f"{args.threads} threads")
    for name, r in got.items():
        print(f"  {name:7s} scoring memory {r['peak_mb'] - r['base_mb']:8.0f} MB above the loaded model "
              f"(peak RSS {r['peak_mb']:.0f} MB) · {r['seconds']:.2f} s")
    ratio = (b["peak_mb"] - b["base_mb"]) / max(a["peak_mb"] - a["base_mb"], 1.0)
    print(f"memory: ours {ratio:.1f}× less · time ratio {b['seconds'] / a['seconds']:.2f}× · "
          f"largest score difference {diff:.2e}")


if __name__ == "__main__":
    main()
