"""Pretraining: next-token prediction over Megatron token files (blends and splits as Megatron builds them)."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import Field, field_validator

from longboat.config.base import ConfigError, StrictModel
from longboat.data.indexed import IndexedDataset, index_path, strip_suffix
from longboat.data.tokenizer import TOKENIZER_FILES, Tokenizer
from longboat.tasks.base import Task, TaskData, register_task
from longboat.tasks.lm_loss import make_lm_loss


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


@register_task("pretrain")
class Pretrain(Task):
    """Next-token prediction over Megatron token files, in the sample order Megatron's GPTDataset builds."""

    data_config = PretrainDataConfig
    unit = "tokens"

    def build(self, model_cfg, train_cfg, seed: int, dp_size: int) -> TaskData:
        from longboat.data.blend import build_gpt_datasets
        from longboat.data.gpt import GPTDatasetConfig

        data: PretrainDataConfig = self.data
        tokenizer = check_inputs(data, model_cfg.vocab_size)
        global_batch = train_cfg.micro_batch_size * train_cfg.grad_accum * dp_size
        n_train = train_cfg.steps * global_batch
        n_valid = train_cfg.eval_batches * train_cfg.micro_batch_size * dp_size
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
        self._seq_len = data.seq_len
        return TaskData(
            train=train,
            valid=valid,
            loss_fn=make_lm_loss(data.reset_position_ids),
            summary={"train_samples": n_train, "valid_samples": n_valid, "global_batch": global_batch},
        )

    def flops_per_unit(self, model_cfg) -> float | None:
        return float(model_cfg.flops_per_token(self.data.seq_len))

    def eval_metrics(self, loss: float, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), **metrics}

    def export_assets(self) -> dict[str, Path | bytes]:
        return tokenizer_assets(self.data.tokenizer)


def tokenizer_assets(tokenizer_dir: str | Path) -> dict[str, Path | bytes]:
    """The tokenizer files of ``tokenizer_dir`` that an export carries."""
    return {name: Path(tokenizer_dir) / name for name in TOKENIZER_FILES if (Path(tokenizer_dir) / name).is_file()}
