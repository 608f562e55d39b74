"""Typed configuration of the training loop and its checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from longboat.config.base import StrictModel
from longboat.trainer.optim import OptimizerConfig
from longboat.trainer.param_rules import ParamRule
from longboat.trainer.schedule import ScheduleConfig


class EMAConfig(StrictModel):
    decay: float = Field(default=0.999, ge=0, lt=1)
    every: int = Field(default=1, gt=0, description="update every k optimizer steps")
    warmup_steps: int = Field(default=0, ge=0, description="before this step the average copies the weights")


class TrainerConfig(StrictModel):
    steps: int = Field(gt=0)
    micro_batch_size: int = Field(default=8, gt=0)
    grad_accum: int = Field(default=1, gt=0)
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    param_groups: list[ParamRule] = Field(default_factory=list, description="per-component learning-rate scales "
                                          "by glob over parameter names, first match wins; lr_scale 0 freezes")
    clip_grad_norm: float | None = 1.0
    # Autocast dtype for forward/backward; parameters and optimizer state stay fp32.
    dtype: Literal["fp32", "bf16"] = "fp32"
    device: str = Field(default="auto", pattern=r"^[a-z]+$",
                        description="auto (this machine's accelerator, else cpu), cpu, or an accelerator type: cuda, xpu, mps")
    threads: int | None = Field(default=None, gt=0, description="CPU threads for torch (None: torch's default)")
    keep_freed_memory: bool = Field(default=False, description="keep freed CPU memory in the process for reuse "
                                    "(glibc): faster steps on CPU, a higher peak resident size")
    log_every: int = Field(default=10, gt=0)
    eval_every: int = Field(default=0, ge=0, description="0: evaluate only at the end")
    eval_batches: int = Field(default=10, ge=0)
    # A step whose loss or gradient is not finite is skipped; this many in a row stop the run.
    max_consecutive_nonfinite: int = Field(default=5, gt=0)
    num_workers: int = Field(default=2, ge=0)
    tensorboard: bool = True
    ema: EMAConfig | None = Field(default=None, description="exponential moving average of the weights, used for "
                                  "evaluation and export")


class CheckpointConfig(StrictModel):
    every: int = Field(default=0, ge=0, description="save every N steps (0: only at the end)")
    keep: int = Field(default=3, gt=0)
    resume: bool = True
    export: bool = Field(default=True, description="write a safetensors export when training ends")
    export_hf: bool | str = Field(
        default=False, description="also write a Hugging Face directory (run_dir/hf): true for the model's own "
        "family, or an HF model_type such as llama, qwen2",
    )
