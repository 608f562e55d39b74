"""LoRA in a training run: which parameters train, and the exports (merged weights, a PEFT adapter)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from longboat.config.base import ConfigError
from longboat.models import ModelSpec
from longboat.models.lora import LoRAConfig, is_lora_name, merged_state_dict
from longboat.models.peft_adapter import save_peft_adapter
from longboat.trainer.optim import ParamGroup


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


def split_adapters(state: dict[str, torch.Tensor], cfg: LoRAConfig) -> tuple[dict, dict]:
    """``(merged full state dict, the adapter tensors alone)`` of a LoRA model's full state dict."""
    return merged_state_dict(state, cfg), {k: v for k, v in state.items() if is_lora_name(k)}


def save_run_adapter(out: Path, adapters: dict[str, torch.Tensor], merged: dict[str, torch.Tensor],
                     cfg: LoRAConfig, spec: ModelSpec, model_cfg, hf_dir: str) -> Path:
    """The adapters in PEFT's layout, for the HF checkpoint ``hf_dir`` the run started from."""
    family = spec.hf.export_family(model_cfg, True, hf_dir)
    return save_peft_adapter(out, adapters, cfg, os.path.abspath(hf_dir),
                             lambda name: spec.hf.tensor_name(family, name), list(merged))
