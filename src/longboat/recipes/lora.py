"""LoRA as a model transform: adapters on the built model, only they train, and every export folds them into the
plain architecture; a run that started from a Hugging Face directory also leaves the adapters in PEFT's layout."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from longboat.config.base import ConfigError
from longboat.models import ModelSpec
from longboat.models.lora import LoRAConfig, apply_lora, is_lora_name, merge_lora, merged_state_dict
from longboat.models.peft_adapter import save_peft_adapter
from longboat.recipes.transforms import ModelTransform
from longboat.trainer.optim import ParamGroup
from longboat.utils.logging import console

if TYPE_CHECKING:
    from longboat.recipes.config import ResolvedRun


class LoRATransform(ModelTransform):
    key = "lora"

    def __init__(self, cfg: LoRAConfig):
        self.cfg = cfg

    def apply(self, model: nn.Module) -> None:
        apply_lora(model, self.cfg)

    def trainable(self, model: nn.Module, groups: list[ParamGroup] | None) -> list[ParamGroup]:
        return lora_param_groups(model, groups)

    def check_parallel(self, tp: int) -> None:
        if tp > 1:
            # Tensor-parallel styles shard a linear layer's weight, not its adapters, whose A and B would need
            # their own placements (replicated A under a column split, B under a row split).
            raise ConfigError(f"lora: LoRA does not combine with tensor parallelism (parallel.tp={tp}); "
                              "use parallel.tp=1 with FSDP or DDP, which shard or replicate the adapters correctly")

    def fold_model(self, model: nn.Module) -> None:
        merge_lora(model)

    def fold_state(self, state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
        return merged_state_dict(state, self.cfg), {k: v for k, v in state.items() if is_lora_name(k)}

    def save_beside(self, run_dir: Path, own: dict[str, torch.Tensor], plain: dict[str, torch.Tensor],
                    resolved: ResolvedRun) -> Path | None:
        if resolved.source.hf is None:  # a PEFT adapter names its base model's directory: there is none to name
            return None
        out = save_run_adapter(run_dir / "adapter", own, plain, self.cfg, resolved.spec, resolved.model,
                               resolved.source.hf)
        console.print(f"saved the LoRA adapter (PEFT) to {out}")
        return out

    def record(self) -> dict:
        return self.cfg.model_dump(mode="json")

    def describe(self) -> str:
        return f"LoRA rank {self.cfg.rank}"


def lora_param_groups(model: nn.Module, task_groups: list[ParamGroup] | None) -> list[ParamGroup]:
    """Only the adapters train. A task's groups restrict them: an adapter joins the group that names it or its
    base weight (with that group's learning-rate scale and decay); one whose module no group names stays frozen."""
    names = [n for n, _ in model.named_parameters() if is_lora_name(n)]
    if task_groups is None:
        return [ParamGroup(names)]
    groups = []
    for group in task_groups:
        named = set(group.names)
        members = [n for n in names if n in named or f"{n.rpartition('.')[0]}.weight" in named]
        if members:
            groups.append(ParamGroup(members, group.lr_scale, group.weight_decay))
    if not groups:
        raise ConfigError("lora.targets: no adapted module lies in the task's parameter groups, so nothing would "
                          "train; target layers of the components the task trains")
    return groups


def save_run_adapter(out: Path, adapters: dict[str, torch.Tensor], merged: dict[str, torch.Tensor],
                     cfg: LoRAConfig, spec: ModelSpec, model_cfg, hf_dir: str) -> Path:
    """The adapters in PEFT's layout, for the HF checkpoint ``hf_dir`` the run started from."""
    family = spec.hf.export_family(model_cfg, True, hf_dir)
    return save_peft_adapter(out, adapters, cfg, os.path.abspath(hf_dir),
                             lambda name: spec.hf.tensor_name(family, name), list(merged))
