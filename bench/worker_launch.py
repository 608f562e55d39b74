"""Run a benchmark's own worker mode in one process or under torchrun on 2 ranks, and read back its result.

The worker prints one ``RESULT {json}`` line (rank 0 only); anything else on stdout is ignored.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

RESULT = "RESULT "


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
