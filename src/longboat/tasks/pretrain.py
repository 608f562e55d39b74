"""Pretraining: next-token prediction over Megatron token files (blends and splits as Megatron builds them)."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import Field, field_validator

from longboat.config.base import ConfigError, StrictModel
from longboat.data.blend import build_gpt_datasets
from longboat.data.gpt import GPTDatasetConfig
from longboat.data.indexed import IndexedDataset, index_path, strip_suffix
from longboat.data.split import split_weights
from longboat.data.token_range import max_token_id
from longboat.data.tokenizer import TOKENIZER_FILES, Tokenizer
from longboat.models.contracts import require_language_model
from longboat.models.registry import hooks_for_config
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
    reset_position_ids: bool = Field(default=False, description="positions restart at 0 after each end-of-document")
    reset_attention_mask: bool = Field(
        default=False, description="attention stays within each document of a sample (Megatron's reset_attention_mask)"
    )
    cache_dir: str | None = Field(default=None, description="index cache (default: beside the first token file)")

    @field_validator("split")
    @classmethod
    def _check_split(cls, value: str) -> str:
        try:
            split_weights(value)
        except ConfigError as e:  # pydantic reports a ValueError under the key, as one line
            raise ValueError(str(e)) from None
        return value

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


def check_inputs(cfg: PretrainDataConfig, model_cfg) -> Tokenizer:
    """Fail before any work if a file is missing, or the tokenizer, the token ids or the sequence length do not
    fit the model."""
    tokenizer = tokenizer_fitting(cfg.tokenizer, cfg.seq_len, model_cfg)
    if tokenizer.eos_id is None:
        raise ConfigError(f"data.tokenizer: {cfg.tokenizer} defines no end-of-document (eos) token")
    for entry in cfg.paths:
        prefix = strip_suffix(entry.path)
        if not index_path(prefix).is_file():
            raise ConfigError(f"data.paths: {entry.path}: no token files {prefix}.bin/.idx")
        top = max_token_id(IndexedDataset(prefix), index_cache_dir(cfg))  # IndexedDataset validates the files
        if top >= model_cfg.vocab_size:
            raise ConfigError(f"data.paths: {prefix}.bin holds token id {top}, beyond the model's embedding "
                              f"(model.vocab_size={model_cfg.vocab_size}); was it tokenized with another tokenizer?")
    return tokenizer


def tokenizer_fitting(tokenizer_dir: str, seq_len: int, model_cfg) -> Tokenizer:
    """The tokenizer of ``data.tokenizer``, after checking that it and ``data.seq_len`` fit the model."""
    if seq_len > model_cfg.max_seq_len:
        raise ConfigError(f"data.seq_len={seq_len} exceeds model.max_seq_len={model_cfg.max_seq_len}; "
                          "lower data.seq_len or raise model.max_seq_len")
    tokenizer = Tokenizer(tokenizer_dir)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ConfigError(
            f"data.tokenizer: {tokenizer_dir} has {tokenizer.vocab_size} tokens, more than the model's embedding "
            f"(model.vocab_size={model_cfg.vocab_size}); raise model.vocab_size to at least {tokenizer.vocab_size}"
        )
    return tokenizer


def index_cache_dir(cfg: PretrainDataConfig) -> str:
    return cfg.cache_dir or str(Path(strip_suffix(cfg.paths[0].path)).parent / "index_cache")


@register_task("pretrain")
class Pretrain(Task):
    """Next-token prediction over Megatron token files, in the sample order Megatron's GPTDataset builds."""

    data_config = PretrainDataConfig
    unit = "tokens"

    def check(self, model_cfg) -> None:
        check_inputs(self.data, require_language_model(model_cfg, "pretrain"))

    def build(self, model_cfg, train_cfg, seed: int, dp_size: int) -> TaskData:
        data: PretrainDataConfig = self.data
        tokenizer = Tokenizer(data.tokenizer)
        global_batch = train_cfg.micro_batch_size * train_cfg.grad_accum * dp_size
        n_train = train_cfg.steps * global_batch
        n_valid = train_cfg.eval_batches * train_cfg.micro_batch_size * dp_size
        cache_dir = index_cache_dir(data)
        gpt_cfg = GPTDatasetConfig(
            seq_len=data.seq_len,
            seed=seed,
            split=data.split,
            eod_id=tokenizer.eos_id,
            eod_mask_loss=data.eod_mask_loss,
            reset_position_ids=data.reset_position_ids,
            reset_attention_mask=data.reset_attention_mask,
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
            loss_fn=make_lm_loss(data.reset_position_ids, use_segments=data.reset_attention_mask,
                                 extra_inputs=hooks_for_config(model_cfg).model_inputs),
            # Only what will be used: no validation split (weight 0) or no evaluation means no validation samples.
            summary={"train_samples": n_train, "valid_samples": n_valid if valid is not None else 0,
                     "global_batch": global_batch},
        )

    def flops_per_unit(self, model_cfg) -> float | None:
        return float(require_language_model(model_cfg, "pretrain").flops_per_token(self.data.seq_len))

    def eval_metrics(self, loss: float, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), **metrics}

    def export_assets(self) -> dict[str, Path | bytes]:
        return tokenizer_assets(self.data.tokenizer)


def tokenizer_assets(tokenizer_dir: str | Path) -> dict[str, Path | bytes]:
    """The tokenizer files of ``tokenizer_dir`` that an export carries."""
    return {name: Path(tokenizer_dir) / name for name in TOKENIZER_FILES if (Path(tokenizer_dir) / name).is_file()}
