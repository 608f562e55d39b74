"""Shared fixtures: a small real corpus (Python standard library sources) tokenized into Megatron files."""

import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def stdlib_files(n: int) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py"))[:n]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """(tokenizer dir, token-file prefix) for 60 stdlib modules, one document per paragraph."""
    from longboat.data.tokenize import tokenize_to_indexed
    from longboat.data.tokenizer import train_bpe

    work = tmp_path_factory.mktemp("corpus")
    files = stdlib_files(60)
    train_bpe(files, 512, work / "tokenizer", show_progress=False)
    prefix = work / "stdlib_text_document"
    tokenize_to_indexed(files, work / "tokenizer", prefix, txt_mode="paragraph", workers=1, progress=False)
    return work / "tokenizer", str(prefix)


def run_longboat(*args: str, env: dict | None = None, check: bool = False, timeout: float = 300):
    """Run the real command line in a subprocess (as a user would)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "longboat", *args], capture_output=True, text=True,
                          env=full_env, cwd=REPO, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"longboat {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def tiny_run_args(run_dir, corpus, *extra: str) -> list[str]:
    tokenizer, prefix = corpus
    return [
        "train", "configs/pretrain/quickstart.yaml", f"run_dir={run_dir}", f"data.tokenizer={tokenizer}",
        f"data.paths=[{prefix}]", "model.vocab_size=512", "model.n_layers=2", "model.d_model=64",
        "model.n_heads=4", "model.n_kv_heads=2", "model.ffn_dim=128", "data.seq_len=64", "model.max_seq_len=128",
        "train.micro_batch_size=4", "train.log_every=1", "train.eval_every=0", "train.eval_batches=2",
        "train.tensorboard=false", "train.threads=1", *extra,
    ]


@pytest.fixture
def one_thread():
    """torch on one thread for the test: tiny models gain nothing from more, and on a busy machine idle pool threads
    spin for a core (Megatron's per-sample masks, tiny policies)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def ctrl_c():
    """Ctrl-C raises KeyboardInterrupt here and in the commands started here, even when the tests were started in
    the background, which ignores SIGINT (and so would every process started from it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


POINT_PLUGIN = REPO / "tests" / "plugins" / "point_sim.py"


@pytest.fixture
def point_plugin():
    """``tests/plugins/point_sim.py`` (a simulator, its runner and a transform); what it registers, and its module,
    are gone after the test, so another test sees the registries as longboat fills them."""
    from longboat.sim.registry import SIMULATORS
    from longboat.data.robot.transforms import base as transforms_base
    from longboat.eval.runners import RUNNERS

    registries = (SIMULATORS, RUNNERS, transforms_base._TRANSFORMS)
    before, modules = [set(r) for r in registries], set(sys.modules)
    yield POINT_PLUGIN
    for registry, names in zip(registries, before):
        for name in set(registry) - names:
            del registry[name]
    for name in set(sys.modules) - modules:
        if name.startswith("longboat_plugin_"):
            del sys.modules[name]
