"""Run a benchmark's own worker mode in one process or under torchrun on 2 ranks, and read back its result.

The worker prints one ``RESULT {json}`` line (rank 0 only); anything else on stdout is ignored. ``lm_step_seconds``
times the real Trainer's step of a (parallelized) language model on random tokens, for workers that compare layouts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

RESULT = "RESULT "


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1 (a wrong value ends in one line naming the option)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def median_seconds(step: Callable[[], object], warmup: int, repeats: int) -> float:
    """The median wall time of ``step()`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def report(result: dict) -> None:
    """What a worker prints for ``launch`` to read."""
    print(RESULT + json.dumps(result), flush=True)


def launch(script: str, args: list[str], ranks: int, threads: int) -> dict:
    """``script args`` in one process (``ranks == 1``) or under ``torchrun --nproc_per_node=ranks``, with
    ``OMP_NUM_THREADS=threads``; its RESULT line, or exit with its output when it fails."""
    cmd = [sys.executable, script, *args]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", script, *args]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{' '.join(cmd[1:3])} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


def lm_step_seconds(model, dp, device, *, vocab: int, seq: int, micro_batch: int, threads: int, warmup: int,
                    steps: int) -> float:
    """The median time of ``Trainer.train_step`` (forward, backward, loss reduction, clipping, AdamW) over
    ``steps`` steps after ``warmup``, on rows of ``seq`` random tokens (row i seeded by i, so every layout reads
    the same data)."""
    import tempfile

    import torch
    from torch.utils.data import Dataset

    from longboat.tasks.lm_loss import make_lm_loss
    from longboat.trainer.config import CheckpointConfig, TrainerConfig
    from longboat.trainer.trainer import Trainer

    class RandomTokens(Dataset):
        def __len__(self):
            return (warmup + steps) * micro_batch * dp.size

        def __getitem__(self, i):
            x = torch.randint(0, vocab, (seq + 1,), generator=torch.Generator().manual_seed(i))
            return {"tokens": x[:-1], "labels": x[1:]}

    train_cfg = TrainerConfig(steps=warmup + steps, micro_batch_size=micro_batch, num_workers=0, tensorboard=False,
                              threads=threads, log_every=10**6)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(train_cfg, CheckpointConfig(export=False), run_dir, model, make_lm_loss(False),
                          RandomTokens(), dp=dp, device=device)
        torch.set_num_threads(threads)
        return median_seconds(trainer.train_step, warmup, steps)
