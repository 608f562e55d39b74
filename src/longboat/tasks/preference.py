"""Preference tuning on chosen/rejected pairs (DPO, IPO, hinge, robust DPO, SimPO), after SFT.

Pairs are read and checked as SFT reads conversations (malformed rows counted by reason, the run failing past
``max_malformed_fraction``), rendered with the chat template and packed whole into rows: the chosen and the
rejected answer of a pair are two segments of one row, so a pair costs one forward pass and no padding.

The reference the losses compare against is the model the run starts from:
- ``precompute`` (default): before the first step, every pair's reference log-probabilities are computed once with
  the starting weights (all ranks sharing the work) and kept in ``<run_dir>/reference_logps.safetensors``, keyed by
  the training and validation rows; a resumed run reads them back. No reference model is held during training.
- ``adapters_off``: with a ``lora:`` section, the same model with its adapters switched off, run under no_grad in
  each step: no copy at all.
- ``copy``: a frozen copy of the starting model, built and sharded as the trained one is, run under no_grad in each
  step. The starting weights are kept in ``<run_dir>/reference/`` (a DCP checkpoint), so a resumed run rebuilds the
  same reference.
SimPO needs no reference.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from pydantic import Field, field_validator, model_validator
from safetensors.torch import load as load_safetensors, save as save_safetensors
from torch import nn

from longboat.checkpoint.dcp import CheckpointManager, ModelOptimizerState, load_model_weights
from longboat.config.base import ConfigError, StrictModel
from longboat.data.chat.builtin import resolve_chat_template
from longboat.data.chat.pairs import EncodedPair, PairRows, encode_pairs, fit_pair, pack_pairs, read_pairs
from longboat.data.chat.sources import check_malformed, check_source
from longboat.data.chat.supervision import ChatSupervisor
from longboat.data.tokenizer import Tokenizer
from longboat.distributed.loss import unwrap
from longboat.models.contracts import require_language_model
from longboat.models.lora import adapters_disabled
from longboat.models.registry import hooks_for_config
from longboat.tasks.base import Task, TaskData, register_task
from longboat.tasks.preference_loss import REFERENCE_FREE, LossKind, PairLogps, PreferenceLoss, pair_logps
from longboat.tasks.pretrain import tokenizer_assets, tokenizer_fitting
from longboat.tasks.sft import ChatSource, _pad_id, plain_sources
from longboat.utils.logging import console
from longboat.utils.outputs import replace_file

REFERENCE_FILE = "reference_logps.safetensors"
REFERENCE_DIR = "reference"  # the starting weights of ``reference: copy``


class PreferenceDataConfig(StrictModel):
    tokenizer: str = Field(description="HF tokenizer directory (tokenizer.json)")
    chat_template: str | None = Field(default=None, description="null: the tokenizer's; a built-in name; a .jinja")
    template_kwargs: dict = Field(default_factory=dict)
    sources: list[ChatSource] = Field(min_length=1, description="rows of prompt/chosen/rejected")
    valid_sources: list[ChatSource] = Field(default_factory=list)
    valid_fraction: float = Field(default=0.0, ge=0, lt=1)
    seq_len: int = Field(gt=0, description="a row's tokens: a pair (both answers with their prompt) must fit")
    packing: bool = True
    max_malformed_fraction: float = Field(default=0.01, ge=0, le=1)
    loss: LossKind = "dpo"
    beta: float = Field(default=0.1, gt=0)
    label_smoothing: float = Field(default=0.0, ge=0, lt=0.5, description="robust and simpo: flipped-label rate")
    simpo_gamma: float = Field(default=0.5, ge=0, description="simpo: the target reward margin γ")
    sft_weight: float = Field(default=0.0, ge=0, description="weight of the chosen answer's NLL added to each pair")
    reference: Literal["precompute", "adapters_off", "copy", "none"] = "precompute"

    @field_validator("sources", "valid_sources", mode="before")
    @classmethod
    def _plain_sources(cls, v):
        return plain_sources(v)

    @model_validator(mode="after")
    def _reference_fits_loss(self) -> PreferenceDataConfig:
        if self.loss in REFERENCE_FREE and self.reference != "none":
            self.reference = "none"  # SimPO compares the policy's own answers: there is nothing to compute
        elif self.loss not in REFERENCE_FREE and self.reference == "none":
            raise ValueError(f"loss {self.loss} compares against a reference: set reference to precompute, "
                             "adapters_off or copy (or use loss: simpo, which needs none)")
        return self


@register_task("preference")
class Preference(Task):
    """Preference tuning on chosen/rejected pairs against the starting model as reference."""

    data_config = PreferenceDataConfig
    unit = "pairs"
    epochs = True

    def __init__(self, data: PreferenceDataConfig):
        super().__init__(data)
        self._rows: dict[str, PairRows] = {}
        self._fingerprint: torch.Tensor | None = None
        self._micro_batch = 1
        self.reference_logps: torch.Tensor | None = None  # [train pairs + valid pairs, 2] with ``precompute``
        self.reference_model: nn.Module | None = None  # the frozen copy, with ``copy``

    def check(self, model_cfg) -> None:
        data: PreferenceDataConfig = self.data
        tokenizer = tokenizer_fitting(data.tokenizer, data.seq_len, require_language_model(model_cfg, "preference"))
        if _pad_id(tokenizer) is None:
            raise ConfigError(f"data.tokenizer: {data.tokenizer} names neither a pad nor an eos token to pad rows with")
        resolve_chat_template(tokenizer, data.chat_template)
        for key, sources in (("sources", data.sources), ("valid_sources", data.valid_sources)):
            for i, s in enumerate(sources):
                try:
                    check_source(s.path, s.split)
                except ValueError as e:
                    raise ConfigError(f"data.{key}[{i}]: {e}") from None

    def build(self, model_cfg, train_cfg, seed: int, dp_size: int) -> TaskData:
        data: PreferenceDataConfig = self.data
        tokenizer = Tokenizer(data.tokenizer)
        template, _ = resolve_chat_template(tokenizer, data.chat_template)
        supervisor = ChatSupervisor(tokenizer, template, data.template_kwargs)
        train: list[EncodedPair] = []
        valid: list[EncodedPair] = []
        counts: Counter = Counter()
        for k, source in enumerate(data.sources + data.valid_sources):
            pairs, report = read_pairs(source.path, source.split)
            check_malformed(report, data.max_malformed_fraction)
            encoded, refused = encode_pairs(supervisor, pairs, source.path)
            for i, why in refused.items():
                report.count(pairs[i].row, "rejected by template", None, why)
            fitted = [fit_pair(p, data.seq_len, counts) if p is not None else None for p in encoded]
            for i, p in enumerate(fitted):
                if p is None and encoded[i] is not None:
                    report.count(pairs[i].row, "answers longer than seq_len", None,
                                 f"{len(encoded[i])} tokens for the pair, seq_len {data.seq_len}")
            check_malformed(report, data.max_malformed_fraction)
            kept = [p for p in fitted if p is not None]
            console.print(f"{source.path}: {len(kept)} pairs" + (f" · skipped {report.describe()}"
                                                                  if report.n_malformed else ""))
            if k >= len(data.sources):
                valid += kept
                continue
            order = np.random.default_rng([seed, k]).permutation(len(kept))
            n_valid = round(data.valid_fraction * len(kept))
            valid += [kept[j] for j in sorted(order[:n_valid])]
            train += [kept[j] for j in sorted(order[n_valid:])]
        if not train:
            raise ConfigError(f"data: no training pair fits data.seq_len={data.seq_len}")
        pad_id = _pad_id(tokenizer)
        self._rows = {"train": pack_pairs(train, data.seq_len, pad_id, data.packing)}
        if valid:
            self._rows["valid"] = pack_pairs(valid, data.seq_len, pad_id, data.packing, pair_offset=len(train))
            if len(self._rows["valid"]) < train_cfg.micro_batch_size * dp_size:
                raise ConfigError(f"data: the validation pairs fill {len(self._rows['valid'])} rows, fewer than one "
                                  f"micro-batch on every rank ({train_cfg.micro_batch_size} × {dp_size})")
        self._micro_batch = train_cfg.micro_batch_size
        self._fingerprint = _fingerprint(self._rows.values(), data)
        loss = PreferenceLoss(data.loss, data.beta, data.label_smoothing, data.simpo_gamma, data.sft_weight,
                              self._reference_fn(), hooks_for_config(model_cfg).model_inputs)
        rows = self._rows["train"]
        summary = {"train_pairs": len(train), "train_rows": len(rows), "packing": f"{rows.efficiency:.1%} tokens",
                   "valid_pairs": len(valid), "loss": data.loss, "reference": data.reference,
                   **{name: n for name, n in counts.items() if n}}
        return TaskData(rows, self._rows.get("valid"), loss, summary)

    # ---- the reference --------------------------------------------------------------------------------------
    def _reference_fn(self):
        mode = self.data.reference
        if mode == "none":
            return None
        if mode == "adapters_off":
            return _adapters_off_reference
        if mode == "copy":
            return self._copy_reference
        return self._precomputed_reference

    def _copy_reference(self, model: nn.Module, batch: dict, policy: PairLogps) -> torch.Tensor:
        if self.reference_model is None:
            raise RuntimeError("the reference copy was not built before training")
        return _live_reference(self.reference_model, batch)

    def _precomputed_reference(self, model: nn.Module, batch: dict, policy: PairLogps) -> torch.Tensor:
        if self.reference_logps is None:
            raise RuntimeError("the reference log-probabilities were not computed before training")
        table = self.reference_logps.to(policy.chosen.device)
        return table[policy.ids]

    def before_training(self, model: nn.Module, run_dir: Path, device: torch.device, dp, resumed: bool,
                        replica=None) -> None:
        if self.data.reference == "copy":
            self.reference_model = _frozen_copy(model, Path(run_dir) / REFERENCE_DIR, resumed, replica)
            return
        if self.data.reference == "adapters_off":
            with adapters_disabled(unwrap(model)) as n:
                if n == 0:
                    raise ConfigError("data.reference: adapters_off runs the model without its LoRA adapters as the "
                                      "reference, but the model has none; add a lora: section or use precompute")
            return
        if self.data.reference != "precompute":
            return
        path = Path(run_dir) / REFERENCE_FILE
        key = self._fingerprint
        if path.is_file():
            saved = load_safetensors(path.read_bytes())
            if torch.equal(saved["key"], key):
                self.reference_logps = saved["logps"]
                console.print(f"reference log-probabilities from {path}")
                return
        if resumed:
            raise ConfigError(f"{path}: the reference log-probabilities of these pairs are missing or were computed "
                              "for other data, and a resumed run no longer holds the starting weights to compute "
                              "them; start the run afresh (another run_dir or checkpoint.resume=false)")
        self.reference_logps = compute_reference(model, list(self._rows.values()), self._micro_batch, device, dp)
        if not dist.is_initialized() or dist.get_rank() == 0:
            replace_file(path, save_safetensors({"key": key, "logps": self.reference_logps.contiguous()}))
        console.print(f"reference log-probabilities of {len(self.reference_logps)} pairs computed "
                      f"({self.data.loss}, starting weights) and kept in {path}")

    # ---- checkpoints and exports ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rows_fingerprint": self._fingerprint} if self._fingerprint is not None else {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        saved = state.get("rows_fingerprint")
        if saved is not None and self._fingerprint is not None and not torch.equal(saved, self._fingerprint):
            console.print("[yellow]warning:[/] the pairs differ from those the checkpoint was trained on; training "
                          "goes on from the checkpoint's position in the new rows")

    def flops_per_unit(self, model_cfg) -> float | None:
        rows = self._rows.get("train")
        if rows is None or not rows.n_pairs:
            return None
        tokens_per_pair = len(rows.tokens) / rows.n_pairs
        return float(require_language_model(model_cfg, "preference").flops_per_token(self.data.seq_len)
                     * tokens_per_pair)

    def eval_metrics(self, loss: float, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": loss, **metrics}

    def export_assets(self) -> dict[str, Path | bytes]:
        return tokenizer_assets(self.data.tokenizer)


def _adapters_off_reference(model: nn.Module, batch: dict, policy: PairLogps) -> torch.Tensor:
    """The base model's log-probabilities: the same weights with every LoRA adapter switched off."""
    with adapters_disabled(unwrap(model)):
        return _live_reference(model, batch)


@torch.no_grad()
def _live_reference(model: nn.Module, batch: dict) -> torch.Tensor:
    """[pairs, 2]: the chosen and rejected answers' summed log-probabilities under ``model``, without gradients."""
    logits = model(batch["tokens"], positions=batch["position_ids"], segments=batch["segments"])
    reference = pair_logps(logits, batch)
    return torch.stack([reference.chosen, reference.rejected], dim=1)


def _frozen_copy(model: nn.Module, directory: Path, resumed: bool, replica) -> nn.Module:
    """A copy of the starting model, sharded as ``model`` is, frozen and in eval mode.

    A new run first writes its starting weights to ``directory`` (a DCP checkpoint, each rank its shards); the copy
    is always read from there, so a resumed run, whose model holds later weights, gets the same reference.
    """
    if replica is None:
        raise ConfigError("data.reference: copy needs the model built a second time, which pipeline stages "
                          "(parallel.pp > 1) do not allow; use reference: precompute")
    saved = CheckpointManager(directory, keep=1)
    if not resumed:
        saved.save(0, {"train": ModelOptimizerState(model, None)})
    start = saved.latest()
    if start is None:
        raise ConfigError(f"{directory}: the starting weights of the reference copy are missing, and a resumed run "
                          "no longer holds them; start the run afresh (another run_dir or checkpoint.resume=false)")
    copy = replica()
    load_model_weights(start, copy)
    for p in copy.parameters():
        p.requires_grad_(False)
    console.print(f"reference: a frozen copy of the starting weights ({start})")
    return copy.eval()


@torch.no_grad()
def compute_reference(model: nn.Module, datasets: list[PairRows], micro_batch: int, device: torch.device,
                      dp) -> torch.Tensor:
    """Every pair's summed log-probabilities under ``model`` as it is now ([pairs, 2]: chosen, rejected).

    The data-parallel ranks share the rows; each runs the same number of forwards (FSDP gathers weights in every
    one), and the table is summed across them: every pair is computed by exactly one rank.
    """
    n_pairs = sum(d.n_pairs for d in datasets)
    table = torch.zeros(n_pairs, 2, dtype=torch.float32, device=device)
    jobs = [(d, r) for d in datasets for r in range(len(d))]
    mine = jobs[dp.rank::dp.size]
    per_rank = -(-len(jobs) // dp.size)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, per_rank, micro_batch):
            chunk = mine[start:start + micro_batch]
            real = len(chunk)
            chunk = chunk + [jobs[0]] * (micro_batch - real) if real < micro_batch else chunk  # equal forwards
            items = [d[r] for d, r in chunk]
            batch = {k: torch.stack([item[k] for item in items]).to(device) for k in items[0]}
            logits = model(batch["tokens"], positions=batch["position_ids"], segments=batch["segments"])
            got = pair_logps(logits[:real], {k: v[:real] for k, v in batch.items()})  # without the filler rows
            table[got.ids, 0] = got.chosen
            table[got.ids, 1] = got.rejected
    finally:
        model.train(was_training)
    if dp.size > 1:
        dist.all_reduce(table, group=dp.group)
    return table.cpu()


def _fingerprint(rows, data: PreferenceDataConfig) -> torch.Tensor:
    """Of the packed rows (tokens, labels, layout) and the settings that shape them: the reference cache's key."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(json.dumps({"template": data.chat_template, "kwargs": data.template_kwargs}, sort_keys=True,
                             default=str).encode())
    for r in rows:
        for array in (r.tokens, r.labels, r.starts, r.row_starts, r.row_samples):
            digest.update(np.ascontiguousarray(array).tobytes())
    return torch.from_numpy(np.frombuffer(digest.digest(), dtype=np.int64).copy())
