"""LoRA adapters written in PEFT's layout, loadable with ``peft.PeftModel.from_pretrained`` onto the HF base.

``adapter_config.json`` (peft_type LORA, r, lora_alpha, target_modules in HF names, ...) and
``adapter_model.safetensors`` with PEFT's tensor names, ``base_model.model.<hf module>.lora_A.weight``. Our
names become HF's through the architecture's HF name map (``hf_name``: our tensor name -> HF tensor name).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from longboat.errors import LongboatError
from longboat.models.lora import LORA_PARAMS, LoRAConfig
from longboat.utils.outputs import staged_output

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


class AdapterExportError(LongboatError, ValueError):
    """An adapted module has no counterpart in the Hugging Face checkpoint the run started from."""


def peft_tensors(lora: dict[str, torch.Tensor], hf_name: Callable[[str], str | None]) -> tuple[dict, list[str]]:
    """``(PEFT state dict, HF module names adapted)`` from our adapter tensors (``<module>.lora_A``/``lora_B``)."""
    tensors, modules = {}, set()
    for key, value in lora.items():
        module, _, kind = key.rpartition(".")
        if kind not in LORA_PARAMS:
            raise AdapterExportError(f"{key!r} is not an adapter tensor")
        hf_weight = hf_name(f"{module}.weight")
        if hf_weight is None or not hf_weight.endswith(".weight"):
            raise AdapterExportError(f"adapted module {module!r} has no Hugging Face counterpart")
        hf_module = hf_weight.removesuffix(".weight")
        modules.add(hf_module)
        tensors[f"{_PEFT_PREFIX}{hf_module}.{kind}.weight"] = value.detach().to("cpu").contiguous()
    return tensors, sorted(modules)


def _target_modules(adapted: list[str], weighted: list[str]) -> list[str]:
    """PEFT matches a target by name suffix: the leaf names when they pick out exactly the adapted modules
    among all that have weights, else the full module names."""
    leaves = {m.rpartition(".")[2] for m in adapted}
    if {m for m in weighted if m.rpartition(".")[2] in leaves} == set(adapted):
        return sorted(leaves)
    return adapted


def save_peft_adapter(
    out_dir: str | os.PathLike,
    lora: dict[str, torch.Tensor],
    cfg: LoRAConfig,
    base_model: str,
    hf_name: Callable[[str], str | None],
    base_tensors: list[str],
) -> Path:
    """Write ``out_dir`` atomically (a run's own ``adapter`` directory is rewritten, nothing else replaced).

    ``base_tensors``: the names of the base model's tensors, to tell whether leaf names pick out the targets.
    """
    tensors, adapted = peft_tensors(lora, hf_name)
    weighted = [hf.removesuffix(".weight") for hf in map(hf_name, base_tensors) if hf and hf.endswith(".weight")]
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_model),
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": _target_modules(adapted, weighted),
        "use_rslora": cfg.rslora,
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
    }
    with staged_output(out_dir, None) as tmp:
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return Path(out_dir)
