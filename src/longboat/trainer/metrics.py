"""Training metrics to a JSONL file, TensorBoard and the console (rank 0 only)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from longboat.utils.logging import rank


def _fmt(key: str, value) -> str:
    if isinstance(value, float):
        if key == "lr":
            return f"{key} {value:.2e}"
        if abs(value) >= 1e5 or (value != 0 and abs(value) < 1e-3):
            return f"{key} {value:.3e}"
        return f"{key} {value:.4g}"
    return f"{key} {value}"


class MetricsWriter:
    """Appends one JSON object per log step (floats written exactly, so runs compare bitwise)."""

    def __init__(self, run_dir: str | os.PathLike, tensorboard: bool = True):
        self.enabled = rank() == 0
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1)
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def write(self, step: int, metrics: dict, kind: str = "train") -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, **metrics}
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)

    @staticmethod
    def summary(metrics: dict, keys: tuple[str, ...]) -> str:
        return " · ".join(_fmt(k, metrics[k]) for k in keys if k in metrics)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            if self._tb is not None:
                self._tb.close()


def read_metrics(run_dir: str | os.PathLike, kind: str = "train") -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == kind]
