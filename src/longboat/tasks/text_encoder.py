"""A text encoder for text-conditioned generators: a decoder from the model registry whose hidden states embed
captions, with the tokenizer it reads.

The decoder comes from a longboat export or a Hugging Face directory (``path``), or, for tests and demos, from an
architecture and preset with random weights drawn from ``seed``. It is asked for hidden states through its spec (the
``output_head`` hook gives the last layer's, through the model's final norm; another layer's output is taken from
the spec's block list, ``parallel_units``), so any registered decoder serves. Captions are tokenized (a BOS first
where the tokenizer has one), cut to ``max_tokens``, and run in batches of equal length, so no caption's states
depend on padding (nor on its batch, beyond float rounding); the result is padded to the longest with zeros and a mask.

``fingerprint()`` hashes the weights, the tokenizer's files and the settings: what the embedding cache is keyed by.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from longboat.checkpoint.export import EXPORT_CONFIG, ExportError, load_export_weights, read_export_config
from longboat.config.base import ConfigError, StrictModel, validate
from longboat.data.tokenizer import Tokenizer, TokenizerError
from longboat.models import get_model, hf_spec
from longboat.models.registry import ModelSpec, hooks_of


def _is_hf(path: Path) -> bool:
    """A Hugging Face directory (a config.json and no longboat export config)."""
    return (path / "config.json").is_file() and not (path / EXPORT_CONFIG).is_file()


class TextEncoderConfig(StrictModel):
    path: str | None = Field(default=None, description="a longboat export or Hugging Face directory of a decoder")
    arch: str | None = Field(default=None, description="instead of path: an architecture with random weights")
    preset: str | None = Field(default=None, description="arch's preset")
    overrides: dict[str, Any] = Field(default_factory=dict, description="arch: fields over the preset")
    seed: int = Field(default=0, description="arch: the seed of the random weights")
    tokenizer: str | None = Field(default=None, description="a tokenizer directory (default: path's own)")
    layer: int = Field(default=-1, description="the block whose output embeds a caption (-1: the last, through "
                                               "the model's final norm)")
    normalize: bool = Field(default=True, description="RMS-normalise an inner layer's states (no weight)")
    max_tokens: int = Field(default=32, gt=0, description="tokens kept per caption (a BOS counts)")
    batch_size: int = Field(default=64, gt=0, description="captions encoded at once")
    cache_dir: str | None = Field(default=None, description="where embedding caches go (default: beside a source "
                                                            "file, else ~/.cache/longboat/text_embeddings)")

    @model_validator(mode="after")
    def _check(self) -> TextEncoderConfig:
        if (self.path is None) == (self.arch is None):
            raise ValueError("give exactly one of path (an export or Hugging Face directory) or arch (+ preset)")
        if self.path is None and self.tokenizer is None:
            raise ValueError("arch needs tokenizer (a tokenizer directory)")
        return self


class TextEncoder:
    """The decoder and tokenizer of a ``TextEncoderConfig``; the weights load on first use."""

    def __init__(self, cfg: TextEncoderConfig, where: str = "data.text_encoder"):
        self.cfg, self.where = cfg, where
        self.spec, self.model_cfg = self._describe()
        self._model: torch.nn.Module | None = None
        self._tokenizer: Tokenizer | None = None
        self._fingerprint: str | None = None
        self.calls = 0  # captions encoded (the cache tests count them)

    # ---- what the encoder is ----------------------------------------------------------------------------------------
    def _describe(self) -> tuple[ModelSpec, StrictModel]:
        cfg = self.cfg
        try:
            if cfg.arch is not None:
                spec = get_model(cfg.arch)
                fields = {**(spec.load_preset(cfg.preset) if cfg.preset else {}), **cfg.overrides}
                return spec, validate(spec.config, fields, self.where, prefix="overrides")
            path = Path(cfg.path)
            if _is_hf(path):
                spec = hf_spec(path)
                return spec, validate(spec.config, spec.hf.config_fields(path), str(path))
            meta = read_export_config(path)
            spec = get_model(meta["arch"])
            return spec, validate(spec.config, meta["model"], str(path))
        except (ExportError, ConfigError) as e:
            raise ConfigError(f"{self.where}: {e}") from None

    def _head(self, model: torch.nn.Module):
        head = hooks_of(model).output_head
        if head is None:
            raise ConfigError(f"{self.where}: architecture '{self.spec.name}' offers no hidden states (its spec has "
                              "no output_head hook); use a decoder")
        return head(model)

    @property
    def hidden_size(self) -> int:
        """The width of the embeddings, read off the model built on the meta device (no weights)."""
        with torch.device("meta"):
            model = self.spec.build(self.model_cfg)
        return int(self._head(model)[1].shape[1])

    def blocks(self, model: torch.nn.Module) -> torch.nn.ModuleList:
        """The model's blocks (its spec's first ``parallel_units``), ``layer`` checked against their number."""
        if not self.spec.parallel_units:
            raise ConfigError(f"{self.where}.layer: architecture '{self.spec.name}' names no block list")
        blocks = model.get_submodule(self.spec.parallel_units[0])
        if not -len(blocks) <= self.cfg.layer < len(blocks):
            raise ConfigError(f"{self.where}.layer={self.cfg.layer}: the encoder has {len(blocks)} blocks")
        return blocks

    def check(self) -> None:
        """Refuse a ``layer`` the decoder lacks, before any weight is read."""
        if self.cfg.layer != -1:
            with torch.device("meta"):
                self.blocks(self.spec.build(self.model_cfg))

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            self.check()
            self._model = self._load().eval().requires_grad_(False)
        return self._model

    def _load(self) -> torch.nn.Module:
        cfg = self.cfg
        if cfg.arch is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                return self.spec.build(self.model_cfg).float()
        path = Path(cfg.path)
        if _is_hf(path):
            return self.spec.hf.load(path, "float32")[0]
        model = self.spec.build(self.model_cfg).float()
        try:
            load_export_weights(path, model)
        except ExportError as e:
            raise ConfigError(f"{self.where}: {e}") from None
        return model

    @property
    def tokenizer_dir(self) -> Path:
        return Path(self.cfg.tokenizer or self.cfg.path)

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            try:
                self._tokenizer = Tokenizer(self.tokenizer_dir)
            except TokenizerError as e:
                raise ConfigError(f"{self.where}.tokenizer: {e}") from None
        return self._tokenizer

    def settings(self) -> dict:
        """What the embeddings depend on besides weights and tokenizer files."""
        return {"arch": self.spec.name, "layer": self.cfg.layer, "normalize": self.cfg.normalize,
                "max_tokens": self.cfg.max_tokens}

    def fingerprint(self) -> str:
        """sha256 of the weights (names, dtypes, shapes, bytes), the tokenizer's files and ``settings()``."""
        if self._fingerprint is None:
            h = hashlib.sha256(json.dumps(self.settings(), sort_keys=True).encode())
            for name, tensor in sorted(self.model.state_dict().items()):
                t = tensor.detach().cpu().contiguous()
                h.update(f"{name}|{t.dtype}|{list(t.shape)}".encode())
                h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            for file in sorted(p for p in self.tokenizer_dir.iterdir() if p.is_file() and "tokenizer" in p.name
                               or p.name == "special_tokens_map.json"):
                h.update(file.name.encode())
                h.update(file.read_bytes())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    # ---- encoding ---------------------------------------------------------------------------------------------------
    def token_ids(self, captions: list[str]) -> list[list[int]]:
        tok = self.tokenizer
        prefix = [tok.bos_id] if tok.bos_id is not None else []
        fallback = [tok.eos_id if tok.eos_id is not None else 0]  # an empty caption without a BOS still has a token
        return [(prefix + ids)[: self.cfg.max_tokens] or fallback for ids in tok.encode_batch(captions)]

    @torch.no_grad()
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeddings float32 [N, L, D], mask bool [N, L]) of ``captions``, L the longest caption's tokens."""
        model = self.model
        hidden, _ = self._head(model)
        device = next(model.parameters()).device
        ids = self.token_ids(captions)
        length = max(len(s) for s in ids)
        out = torch.zeros(len(ids), length, self.hidden_size)
        mask = torch.zeros(len(ids), length, dtype=torch.bool)
        by_length: dict[int, list[int]] = {}
        for i, s in enumerate(ids):
            by_length.setdefault(len(s), []).append(i)
        captured: list[torch.Tensor] = []
        handle = None
        if self.cfg.layer != -1:
            handle = self.blocks(model)[self.cfg.layer].register_forward_hook(
                lambda _m, _i, o: captured.append(o[0] if isinstance(o, tuple) else o))
        try:
            for n, rows in sorted(by_length.items()):
                for start in range(0, len(rows), self.cfg.batch_size):
                    chunk = rows[start:start + self.cfg.batch_size]
                    tokens = torch.tensor([ids[i] for i in chunk], dtype=torch.long, device=device)
                    captured.clear()
                    states = hidden(tokens, None)
                    if handle is not None:
                        states = captured[-1]
                        if self.cfg.normalize:
                            states = F.rms_norm(states.float(), (states.shape[-1],), eps=1e-6)
                    out[chunk, :n] = states.float().cpu()
                    mask[chunk, :n] = True
        finally:
            if handle is not None:
                handle.remove()
        self.calls += len(captions)
        return out, mask
