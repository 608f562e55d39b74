"""Pretraining: next-token prediction over Megatron token files (blends and splits as Megatron builds them)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator

from longboat.config.base import ConfigError, StrictModel
from longboat.data.indexed import IndexedDataset, index_path, strip_suffix
from longboat.data.tokenizer import Tokenizer
from longboat.models.moe import MoE
from longboat.tasks.registry import TaskParts, register_task
from longboat.trainer.trainer import LossFn, LossOutput

IGNORE_INDEX = -100


class BlendEntry(StrictModel):
    path: str
    weight: float = Field(default=1.0, gt=0)


class PretrainDataConfig(StrictModel):
    tokenizer: str = Field(description="HF tokenizer directory (tokenizer.json)")
    paths: list[BlendEntry] = Field(min_length=1, description="token file prefixes, optionally weighted")
    split: str = "969,30,1"
    seq_len: int = Field(gt=0)
    eod_mask_loss: bool = False
    reset_position_ids: bool = False
    cache_dir: str | None = Field(default=None, description="index cache (default: beside the first token file)")

    @field_validator("paths", mode="before")
    @classmethod
    def _plain_paths(cls, v):
        """Accept ``[prefix, ...]`` and Megatron's flat ``[w1, prefix1, w2, prefix2]`` besides mappings."""
        if isinstance(v, str):
            v = [v]
        if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v[0::2]) and len(v) % 2 == 0 \
                and all(isinstance(x, str) for x in v[1::2]):
            return [{"path": p, "weight": w} for w, p in zip(v[0::2], v[1::2])]
        if isinstance(v, list):
            return [{"path": x} if isinstance(x, str) else x for x in v]
        return v


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder inside a DistributedDataParallel wrapper (FSDP2 keeps the model's own class)."""
    return getattr(model, "module", model)


def moe_metrics(aux: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Load-balance statistics of one forward: the worst layer's busiest and idlest expert relative to the
    mean load (1 and 1 when balanced) and the fraction of routed token copies dropped by capacity."""
    load = aux["load"]  # [n_moe_layers, n_experts]
    mean = load.mean(dim=1).clamp(min=1e-9)
    return {
        "moe_aux_loss": aux["loss"].detach(),
        "moe_load_max": (load.max(dim=1).values / mean).max(),
        "moe_load_min": (load.min(dim=1).values / mean).min(),
        "moe_dropped": aux["dropped"].sum() / load.sum().clamp(min=1),
    }


def make_lm_loss(use_position_ids: bool) -> LossFn:
    """Summed next-token cross-entropy over pre-shifted labels (-100 ignored), plus MoE aux losses in training.

    The trainer divides the sum by the global token count, so the aux loss enters as ``aux * local_count``:
    after normalisation it is the token-weighted mean of the micro-batches' aux losses.
    """

    def lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        # Default positions (0..T-1) are computed inside the model; pass ids only when they reset at EOD.
        logits = model(batch["tokens"], batch["position_ids"] if use_position_ids else None)
        labels = batch["labels"]
        loss_sum = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        count = (labels != IGNORE_INDEX).sum()
        moe_aux = getattr(_unwrap(model), "moe_aux", None)
        aux = moe_aux() if moe_aux is not None and model.training else None
        if aux is None:
            return LossOutput(loss_sum, count, labels.numel())
        return LossOutput(loss_sum + aux["loss"] * count, count, labels.numel(), moe_metrics(aux))

    return lm_loss


def update_expert_biases(model: torch.nn.Module, group=None) -> None:
    """After an optimizer step: move every bias-balanced MoE router towards equal load (DeepSeek-V3)."""
    for module in model.modules():
        if isinstance(module, MoE) and module.cfg.use_expert_bias:
            module.update_expert_bias(group=group)


def check_inputs(cfg: PretrainDataConfig, model_vocab: int) -> Tokenizer:
    """Fail before any work if a file is missing or the tokenizer does not fit the model."""
    tokenizer = Tokenizer(cfg.tokenizer)
    if tokenizer.vocab_size > model_vocab:
        raise ConfigError(
            f"data.tokenizer: {cfg.tokenizer} has {tokenizer.vocab_size} tokens, more than the model's embedding "
            f"(model.vocab_size={model_vocab}); raise model.vocab_size to at least {tokenizer.vocab_size}"
        )
    if tokenizer.eos_id is None:
        raise ConfigError(f"data.tokenizer: {cfg.tokenizer} defines no end-of-document (eos) token")
    for entry in cfg.paths:
        if not index_path(strip_suffix(entry.path)).is_file():
            raise ConfigError(f"data.paths: {entry.path}: no token files {strip_suffix(entry.path)}.bin/.idx")
        IndexedDataset(entry.path)  # validates header and sizes
    return tokenizer


@register_task("pretrain", PretrainDataConfig)
def build_pretrain(data: PretrainDataConfig, model_cfg, trainer_cfg, seed: int, dp_size: int) -> TaskParts:
    from longboat.data.blend import build_gpt_datasets
    from longboat.data.gpt import GPTDatasetConfig

    tokenizer = check_inputs(data, model_cfg.vocab_size)
    global_batch = trainer_cfg.micro_batch_size * trainer_cfg.grad_accum * dp_size
    n_train = trainer_cfg.steps * global_batch
    n_valid = trainer_cfg.eval_batches * trainer_cfg.micro_batch_size * dp_size
    cache_dir = data.cache_dir or str(Path(strip_suffix(data.paths[0].path)).parent / "index_cache")
    gpt_cfg = GPTDatasetConfig(
        seq_len=data.seq_len,
        seed=seed,
        split=data.split,
        eod_id=tokenizer.eos_id,
        eod_mask_loss=data.eod_mask_loss,
        reset_position_ids=data.reset_position_ids,
        cache_dir=cache_dir,
    )
    train, valid, _ = build_gpt_datasets(
        [(strip_suffix(e.path), e.weight) for e in data.paths], data.split, [n_train, n_valid, 0], gpt_cfg
    )
    if train is None:
        raise ConfigError(f"data.split '{data.split}' gives the training split no documents")
    return TaskParts(
        train=train,
        valid=valid,
        loss_fn=make_lm_loss(data.reset_position_ids),
        flops_per_unit=float(model_cfg.flops_per_token(data.seq_len)),
        tokenizer_dir=Path(data.tokenizer),
        summary={"train_samples": n_train, "valid_samples": n_valid, "global_batch": global_batch},
        after_step=update_expert_biases if getattr(getattr(model_cfg, "moe", None), "use_expert_bias", False) else None,
    )
