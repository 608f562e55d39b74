"""The one training loop: LLM pretraining, SFT and robot policies all run through ``Trainer.fit``.

It knows nothing about text or robots: a task hands it a model, datasets and a loss function that returns
the *sum* of per-item losses and the number of items. The loop normalises by the item count of the whole
global batch (all micro-batches, all data-parallel ranks), so accumulation and world size leave the loss
unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol

import torch
import torch.distributed as dist
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn
from torch.utils.data import Dataset

from longboat.errors import LongboatError
from longboat.checkpoint.dcp import CheckpointManager, ModelOptimizerState, load_task_state
from longboat.data.loader import EpochOrder, ResumableLoader
from longboat.distributed.loss import LossFn, LossOutput, StagedLoss, unwrap  # noqa: F401  (the trainer's API)
from longboat.models.registry import hooks_of
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.trainer.ema import EMA
from longboat.trainer.grad_norm import clip_grad_norm
from longboat.trainer.hooks import TrainerHooks
from longboat.trainer.metrics import MetricsWriter
from longboat.trainer.mfu import cpu_bf16_is_slow, peak_flops
from longboat.trainer.optim import ParamGroup, build_optimizer
from longboat.trainer.schedule import build_scheduler
from longboat.utils.device import keep_freed_cpu_memory, peak_memory_mb, resolve_device, set_threads
from longboat.utils.logging import console, rank


class TrainingError(LongboatError, RuntimeError):
    """Training cannot go on (e.g. the loss keeps diverging)."""


class Pipeline(Protocol):
    """Runs a step's micro-batches through pipeline stages (``longboat.distributed.pipeline``); every stage gets
    the totals (summed loss, count and units; metrics averaged over the micro-batches)."""

    def train_step(self, batches: list[dict]) -> LossOutput: ...
    def evaluate(self, batches: list[dict]) -> LossOutput: ...
    def counted_elsewhere(self) -> list[nn.Parameter]: ...  # gradients another stage counts in the norm

    @property
    def stage_ranks(self) -> int: ...  # how many ranks hold each stage


@dataclass
class DataParallel:
    """Where this rank sits among data-parallel replicas (1 of 1 when not distributed)."""

    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None


@dataclass
class FitResult:
    step: int
    train_loss: float | None
    valid_loss: float | None
    skipped_steps: int
    stopped_by_signal: bool = False
    signal: int | None = None  # the signal that stopped it


def _to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class Trainer:
    def __init__(
        self,
        cfg: TrainerConfig,
        checkpoint: CheckpointConfig,
        run_dir: str | Path,
        model: nn.Module,
        loss_fn: LossFn,
        train_data: Dataset,
        valid_data: Dataset | None = None,
        flops_per_unit: float | None = None,
        dp: DataParallel | None = None,
        device: torch.device | None = None,
        hooks: TrainerHooks | None = None,
        param_groups: list[ParamGroup] | None = None,
        seed: int = 0,
        pipeline: Pipeline | None = None,
        replica: Callable[[], nn.Module] | None = None,
    ):
        self.cfg, self.ckpt_cfg = cfg, checkpoint
        self.run_dir = Path(run_dir)
        self.dp = dp or DataParallel()
        self.device = device or resolve_device(cfg.device)
        self.model = model
        self.loss_fn = loss_fn
        self.valid_data = valid_data
        self.flops_per_unit = flops_per_unit
        self.hooks = hooks or TrainerHooks()
        # With pipeline parallelism ``model`` is this rank's stages and the pipeline runs every forward.
        self.pipeline = pipeline
        self.replica = replica  # builds another model sharded like this one, for the hooks (a frozen reference)
        if pipeline is not None and cfg.eval_batches % cfg.grad_accum:
            raise TrainingError(f"train.eval_batches={cfg.eval_batches} must be a multiple of train.grad_accum="
                                f"{cfg.grad_accum} with parallel.pp > 1: the pipeline evaluates a step's worth of "
                                "micro-batches at a time")
        self.optimizer = build_optimizer(model, cfg.optimizer, param_groups)
        self.scheduler = build_scheduler(self.optimizer, cfg.steps, cfg.schedule)
        self.ema = EMA(model, cfg.ema) if cfg.ema is not None else None
        self.global_batch = cfg.micro_batch_size * cfg.grad_accum * self.dp.size
        self._check_data_size(train_data)
        self.loader = ResumableLoader(
            train_data, cfg.micro_batch_size, self.dp.rank, self.dp.size, cfg.num_workers,
            pin_memory=self.device.type != "cpu",
            epochs=EpochOrder(self.global_batch, seed) if self.hooks.epochs else None,
        )
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", keep=checkpoint.keep)
        self.metrics = MetricsWriter(self.run_dir, tensorboard=cfg.tensorboard)
        self.step = 0
        self.skipped_steps = 0
        self._consecutive_nonfinite = 0
        self._stop_signal: int | None = None
        self._autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16) if cfg.dtype == "bf16" else contextlib.nullcontext()
        )
        self._peak = peak_flops(self.device, torch.bfloat16 if cfg.dtype == "bf16" else torch.float32)
        if cfg.dtype == "bf16" and self.device.type == "cpu" and cpu_bf16_is_slow():
            console.print("[yellow]warning:[/] train.dtype=bf16, but this CPU has no native bf16 and multiplies bf16 "
                          "matrices more slowly than fp32; train.dtype=fp32 is faster here")
        # MFU divides by every device of the job: tensor-parallel ranks share a data-parallel replica's work.
        self._n_devices = dist.get_world_size() if dist.is_initialized() else self.dp.size
        after_step = hooks_of(unwrap(model)).after_optimizer_step
        self._after_optimizer_step = functools.partial(after_step, unwrap(model)) if after_step is not None else None

    def _check_data_size(self, data: Dataset) -> None:
        n = len(data)
        if self.hooks.epochs and n < self.global_batch:
            raise TrainingError(
                f"the training data holds {n} samples, fewer than one global batch of {self.global_batch} "
                f"(micro_batch_size {self.cfg.micro_batch_size} × grad_accum {self.cfg.grad_accum} × "
                f"{self.dp.size} data-parallel ranks); lower train.micro_batch_size or add data"
            )
        if not self.hooks.epochs and n < self.cfg.steps * self.global_batch:
            raise TrainingError(
                f"the training data holds {n} samples, but {self.cfg.steps} steps of global batch "
                f"{self.global_batch} need {self.cfg.steps * self.global_batch}"
            )

    # ---- state -------------------------------------------------------------------------------------
    def _state(self) -> dict:
        state = {
            "train": ModelOptimizerState(self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "trainer": {"step": self.step, "skipped_steps": self.skipped_steps, **self.loader.state_dict()},
        }
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def save_checkpoint(self) -> Path:
        return self.checkpoints.save(self.step, self._state(), task_state=self.hooks.state_dict())

    def resume(self, path: Path | None = None) -> bool:
        path = path or self.checkpoints.latest()
        if path is None:
            return False
        state = self._state()
        saved = self.checkpoints.contents(path)
        missing = [key for key in state if key not in saved]
        for key in missing:  # e.g. EMA switched on for a run saved without it: it starts from the loaded weights
            del state[key]
        self.checkpoints.load(path, state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["trainer"]["step"])
        self.skipped_steps = int(state["trainer"]["skipped_steps"])
        self.loader.load_state_dict(state["trainer"])
        task_state = load_task_state(path)
        if task_state is not None:
            self.hooks.load_state_dict(task_state)
        if self.ema is not None:
            if "ema" in state:
                self.ema.load_state_dict(state["ema"])
            else:
                self.ema = EMA(self.model, self.cfg.ema)
        console.print(f"resumed from {path} at step {self.step}" + (f" (without {', '.join(missing)})" if missing else ""))
        return True

    # ---- one step ----------------------------------------------------------------------------------
    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.dp.size > 1:
            dist.all_reduce(t, group=self.dp.group)
        return t

    def _gradient_sync(self, last_micro_batch: bool):
        """DDP all-reduces gradients only on a step's last micro-batch; the others accumulate locally.

        FSDP keeps reducing every micro-batch: skipping would hold unsharded gradients, the memory it exists
        to save.
        """
        if not last_micro_batch and isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _next_batch(self) -> dict:
        try:
            return next(self.loader)
        except StopIteration:
            raise TrainingError(
                f"the training data ran out after {self.loader.consumed} samples ({len(self.loader.dataset)} "
                "in the dataset)"
            ) from None

    def _pipelined(self) -> tuple[torch.Tensor, torch.Tensor, int, dict[str, float], float | None]:
        batches = [_to_device(self._next_batch(), self.device) for _ in range(self.cfg.grad_accum)]
        with self._autocast:
            out = self.pipeline.train_step(batches)
        count = torch.tensor(float(out.count), dtype=torch.float64, device=self.device)
        return out.loss_sum.to(self.device), count, out.units, dict(out.metrics or {}), None

    def _accumulate(self) -> tuple[torch.Tensor, torch.Tensor, int, dict[str, float], float | None]:
        """Forward and backward of the step's micro-batches: (loss sum, count, units, metrics, their weight).
        Without weights the metrics are averaged over the micro-batches (weight None); with them (``LossOutput.
        metrics_weight``), they are weighted sums and the weight is the total."""
        if self.pipeline is not None:
            return self._pipelined()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        count = torch.zeros((), dtype=torch.float64, device=self.device)
        units = 0
        extra: dict[str, float] = {}
        weight: float | None = None
        for i in range(self.cfg.grad_accum):
            batch = _to_device(self._next_batch(), self.device)
            with self._gradient_sync(i == self.cfg.grad_accum - 1):
                with self._autocast:
                    out = self.loss_fn(self.model, batch)
                out.loss_sum.backward()
            loss_sum += out.loss_sum.detach().double()
            count += out.count
            units += out.units
            if out.metrics_weight is not None:
                weight = (weight or 0.0) + float(out.metrics_weight)
            for k, v in (out.metrics or {}).items():
                if out.metrics_weight is None:
                    extra[k] = extra.get(k, 0.0) + float(v) / self.cfg.grad_accum
                else:
                    extra[k] = extra.get(k, 0.0) + float(v) * float(out.metrics_weight)
        return loss_sum, count, units, extra, weight

    def train_step(self) -> dict:
        self.model.train()
        loss_sum, count, units, extra, weight = self._accumulate()
        # The task's metrics (e.g. MoE load) averaged over every micro-batch of the step, on all data-parallel ranks
        # (weighted by the micro-batches' own weights when the task gives them, e.g. per pair).
        names = sorted(extra)
        totals = self._all_reduce(torch.tensor([float(loss_sum), float(count), weight or 0.0,
                                                *(extra[k] for k in names)], dtype=torch.float64, device=self.device))
        if weight is None:
            extra = {k: totals[3 + i].item() / self.dp.size for i, k in enumerate(names)}
        else:
            extra = {k: totals[3 + i].item() / max(totals[2].item(), 1e-12) for i, k in enumerate(names)}
        global_count = max(totals[1].item(), 1.0)
        # Gradients hold the sum over this rank's items, averaged over replicas by DDP/FSDP; rescale them to
        # the mean over every item of the global batch.
        scale = self.dp.size / global_count
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
        max_norm = self.cfg.clip_grad_norm if self.cfg.clip_grad_norm else float("inf")
        # Over the whole model: every mesh its parameters live on, and every pipeline stage.
        if self.pipeline is not None:
            grad_norm = clip_grad_norm(self.model.parameters(), max_norm, self.pipeline.stage_ranks,
                                       self.pipeline.counted_elsewhere())
        else:
            grad_norm = clip_grad_norm(self.model.parameters(), max_norm,
                                       dist.get_world_size() if dist.is_initialized() else 1)
        loss = totals[0].item() / global_count
        finite = math.isfinite(loss) and bool(torch.isfinite(grad_norm))
        lr = self.scheduler.get_last_lr()[0]
        if finite:
            self.optimizer.step()
            if self._after_optimizer_step is not None:  # e.g. MoE expert-bias balancing, outside the gradient
                self._after_optimizer_step(self.dp.group)
            if self.ema is not None:
                self.ema.update(self.step + 1)
            self._consecutive_nonfinite = 0
        else:
            self.skipped_steps += 1
            self._consecutive_nonfinite += 1
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # a skipped step keeps the schedule moving, which torch warns about
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()
        self.step += 1
        if self._consecutive_nonfinite >= self.cfg.max_consecutive_nonfinite:
            raise TrainingError(
                f"step {self.step}: the loss or gradient was not finite for {self._consecutive_nonfinite} steps in a "
                f"row (loss {loss}, grad norm {float(grad_norm)}); lower train.optimizer.lr, enable "
                "train.clip_grad_norm, or check the data"
            )
        return {
            "loss": loss,
            "lr": lr,
            "grad_norm": float(grad_norm),
            "units": units * self.dp.size,
            "skipped": 0 if finite else 1,
            **extra,
        }

    def _eval_outputs(self, loader: ResumableLoader) -> Iterator[tuple[LossOutput, int]]:
        """The loss of each validation micro-batch, or of each step's worth of them through the pipeline, with
        the number of micro-batches it covers."""
        batches = (_to_device(batch, self.device) for _, batch in zip(range(self.cfg.eval_batches), loader))
        if self.pipeline is None:
            for batch in batches:
                with self._autocast:
                    yield self.loss_fn(self.model, batch), 1
            return
        while len(group := list(itertools.islice(batches, self.cfg.grad_accum))) == self.cfg.grad_accum:
            with self._autocast:
                yield self.pipeline.evaluate(group), len(group)

    @torch.no_grad()
    def evaluate(self) -> dict | None:
        """Mean loss over ``eval_batches`` validation micro-batches (EMA weights when on), plus the task's metrics."""
        if self.valid_data is None or self.cfg.eval_batches == 0:
            return None
        self.model.eval()
        loader = ResumableLoader(self.valid_data, self.cfg.micro_batch_size, self.dp.rank, self.dp.size, 0)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        count = torch.zeros((), dtype=torch.float64, device=self.device)
        sums: dict[str, float] = {}
        batches = 0
        with self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext():
            for out, n in self._eval_outputs(loader):
                loss_sum += out.loss_sum.double().to(self.device)
                count += out.count
                w = n if out.metrics_weight is None else float(out.metrics_weight)  # micro-batches, or their weights
                batches += w
                for k, v in (out.metrics or {}).items():
                    sums[k] = sums.get(k, 0.0) + float(v) * w
        names = sorted(sums)
        values = [loss_sum, count, torch.tensor(float(batches), dtype=torch.float64, device=self.device)]
        values += [torch.tensor(sums[k], dtype=torch.float64, device=self.device) for k in names]
        totals = self._all_reduce(torch.stack(values))
        if totals[1].item() == 0:
            return None
        metrics = {k: totals[3 + i].item() / totals[2].item() for i, k in enumerate(names)}
        return self.hooks.eval_metrics(totals[0].item() / totals[1].item(), metrics)

    # ---- the loop ----------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> dict:
        """SIGTERM, SIGUSR1 (a scheduler's notice) and Ctrl-C stop the run after the current step, with a checkpoint.
        In one process a second Ctrl-C stops at once; under torchrun, which passes Ctrl-C on to the ranks that got it
        from the terminal already, the agent's own grace period is the limit."""
        one_process = not (dist.is_initialized() and dist.get_world_size() > 1)

        def handler(signum, frame):
            if signum == signal.SIGINT and self._stop_signal == signal.SIGINT and one_process:
                raise KeyboardInterrupt
            self._stop_signal = signum

        previous = {}
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            if sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:  # started in the background
                continue
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                pass
        return previous

    def _stop_requested(self) -> bool:
        flag = torch.tensor([1.0 if self._stop_signal is not None else 0.0])
        if dist.is_initialized() and dist.get_world_size() > 1:
            # Preemption reaches ranks at different moments; all stop together (tensor and pipeline ranks included).
            dist.all_reduce(flag)
        return bool(flag.item())

    def fit(self) -> FitResult:
        set_threads(self.cfg.threads)
        if self.cfg.keep_freed_memory and not keep_freed_cpu_memory():
            console.print("[yellow]warning:[/] train.keep_freed_memory needs glibc's malloc; this C library keeps "
                          "its own defaults")
        self.model.to(self.device)
        resumed = self.resume() if self.ckpt_cfg.resume else False
        self.hooks.before_training(self.model, self.run_dir, self.device, self.dp, resumed, self.replica)
        previous_handlers = self._install_signal_handlers()
        rate_key = f"{self.hooks.unit}_per_s"
        log_keys = ("loss", "lr", "grad_norm", "epoch", rate_key, "mfu", "peak_mem_mb")
        window_units, window_start = 0, time.perf_counter()
        last_train, last_valid, stopped = None, None, False
        progress = Progress(
            BarColumn(bar_width=20), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
            console=console, transient=False, disable=rank() != 0 or not console.is_terminal,
        )
        try:
            with progress:
                bar = progress.add_task("train", total=self.cfg.steps, completed=self.step, info="")
                while self.step < self.cfg.steps:
                    m = self.train_step()
                    last_train = m["loss"]
                    window_units += m.pop("units")
                    if self.step % self.cfg.log_every == 0 or self.step == self.cfg.steps:
                        elapsed = time.perf_counter() - window_start
                        rate = window_units / elapsed if elapsed > 0 else 0.0
                        m[rate_key] = rate
                        if self.flops_per_unit:
                            m["mfu"] = self._peak.mfu(rate * self.flops_per_unit / self._n_devices)
                        if self.loader.epoch is not None:
                            m["epoch"] = self.loader.epoch
                        m["peak_mem_mb"] = peak_memory_mb(self.device)
                        m["skipped_total"] = self.skipped_steps
                        self.metrics.write(self.step, m)
                        line = MetricsWriter.summary(m, log_keys)
                        progress.update(bar, info=line)
                        if not console.is_terminal:  # logs and CI get a line per log step instead of a bar
                            console.print(f"step {self.step}/{self.cfg.steps} · {line}")
                        window_units, window_start = 0, time.perf_counter()
                    progress.update(bar, completed=self.step)
                    if self.cfg.eval_every and self.step % self.cfg.eval_every == 0 and self.step < self.cfg.steps:
                        last_valid = self._log_eval()
                    if self.ckpt_cfg.every and self.step % self.ckpt_cfg.every == 0 and self.step < self.cfg.steps:
                        self.save_checkpoint()
                    if self._stop_requested():
                        name = signal.Signals(self._stop_signal).name
                        console.print(f"{name}: saving a checkpoint at step {self.step} and stopping")
                        stopped = True
                        break
            if not stopped:
                last_valid = self._log_eval() or last_valid
            if self.checkpoints.latest() is None or not self.checkpoints.latest().name.endswith(f"{self.step:08d}"):
                self.save_checkpoint()
        finally:
            for sig, h in previous_handlers.items():
                signal.signal(sig, h)
            self.metrics.close()
        return FitResult(self.step, last_train, last_valid, self.skipped_steps, stopped,
                         self._stop_signal if stopped else None)

    def _log_eval(self) -> float | None:
        ev = self.evaluate()
        if ev is None:
            return None
        self.metrics.write(self.step, ev, kind="valid")
        console.print(f"step {self.step} · valid {MetricsWriter.summary(ev, tuple(ev))}")
        return ev["loss"]
