"""Peak resident memory of ``load_hf_model`` on a Hugging Face checkpoint of over 1 GB, against the model's size.

A random Qwen3 with Qwen3-0.6B's shape (0.75B parameters, tied) is saved once by transformers'
``save_pretrained`` under ``--dir`` (bf16: 1.4 GiB, in 300 MB shards). Each measurement runs in a fresh Python
process and reports that process's peak RSS (``resource.getrusage``); a process that only imports torch and
longboat gives the baseline, so ``peak - baseline`` is what the import itself holds at its worst. The child
reads every weight after the import: tensors safetensors maps from a file (private copy-on-write pages) count
only once read. This process imports neither torch nor transformers, as Linux carries a parent's peak RSS
into the children it forks.

    python -P bench/hf_import_memory.py [--dir /tmp/longboat-qwen3-0.6b-bf16] [--load-dtypes stored,float32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, resource, sys, time
import torch
from longboat.models.llm.hf import load_hf_model
hf_dir, dtype = sys.argv[1], sys.argv[2]
start, model_bytes = time.perf_counter(), 0
if dtype != "none":
    model, cfg, family = load_hf_model(hf_dir, None if dtype == "stored" else dtype)
    # Read every weight once: tensors safetensors maps from the file count as resident only once touched.
    assert all(torch.isfinite(t.sum()) for t in model.state_dict().values())
    model_bytes = sum(t.nbytes for t in model.state_dict().values())
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "model_mb": model_bytes / 2**20,
                  "seconds": time.perf_counter() - start}))
"""


MAKE = """
import sys
import torch
import transformers
out, dtype, shard = sys.argv[1:]
cfg = transformers.Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                               num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                               max_position_embeddings=40960, tie_word_embeddings=True,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e6})
torch.manual_seed(0)
with torch.device("meta"):
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
model.to_empty(device="cpu")
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.02)
model.save_pretrained(out, max_shard_size=shard)
"""


def measure(hf_dir: Path, dtype: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(hf_dir), dtype], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=Path("/tmp/longboat-qwen3-0.6b-bf16"))
    p.add_argument("--dtype", default="bfloat16", help="dtype the checkpoint is saved in")
    p.add_argument("--shard", default="300MB", help="max_shard_size of the saved checkpoint")
    p.add_argument("--load-dtypes", default="stored,float32", help="dtypes to import into (stored: as saved)")
    args = p.parse_args()
    if not (args.dir / "config.json").is_file():  # a random Qwen3-0.6B-shaped model, saved once
        subprocess.run([sys.executable, "-c", MAKE, str(args.dir), args.dtype, args.shard], check=True)
    files = sorted(args.dir.glob("*.safetensors"))
    size_mb = sum(f.stat().st_size for f in files) / 2**20
    base = measure(args.dir, "none")["peak_mb"]
    print(f"checkpoint {args.dir}: {size_mb:.0f} MiB in {len(files)} files; baseline process {base:.0f} MiB")
    print(f"{'into':>10} {'model MiB':>10} {'peak MiB':>9} {'- baseline':>11} {'/ model':>8} {'seconds':>8}")
    for dtype in args.load_dtypes.split(","):
        r = measure(args.dir, dtype)
        held = r["peak_mb"] - base
        print(f"{dtype:>10} {r['model_mb']:10.0f} {r['peak_mb']:9.0f} {held:11.0f} {held / r['model_mb']:8.2f} "
              f"{r['seconds']:8.1f}")


if __name__ == "__main__":
    main()
