"""A language model from outside the package that meets the language-model contract with an extra input: the LM
tasks pass it, through its spec's ``ModelHooks.model_inputs``, a per-token bias computed from the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from longboat.config.base import StrictModel
from longboat.models import ModelSpec, register_model
from longboat.models.contracts import ModelHooks


class BiasedLMConfig(StrictModel):
    vocab_size: int = Field(gt=0)
    max_seq_len: int = Field(gt=0)
    d_model: int = Field(default=32, gt=0)

    def flops_per_token(self, seq_len: int) -> int:
        return 6 * (2 * self.vocab_size * self.d_model + self.d_model)


class BiasedLM(nn.Module):
    """Embedding, a causal running mean, a learned direction scaled by each token's ``token_bias``, and a head."""

    def __init__(self, cfg: BiasedLMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.bias_direction = nn.Parameter(torch.zeros(cfg.d_model))
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                segments: torch.Tensor | None = None, token_bias: torch.Tensor | None = None) -> torch.Tensor:
        if token_bias is None:
            raise ValueError("BiasedLM needs token_bias (its spec's model_inputs hook gives it from the batch)")
        h = self.embed(tokens)
        h = h.cumsum(1) / torch.arange(1, tokens.shape[1] + 1, device=h.device)[:, None]
        h = h + token_bias[..., None].to(h.dtype) * self.bias_direction
        return self.head(F.gelu(h))


def _model_inputs(batch: dict) -> dict:
    return {"token_bias": (batch["tokens"] % 2).float()}


register_model(ModelSpec("biased_lm", BiasedLMConfig, BiasedLM, hooks=ModelHooks(model_inputs=_model_inputs)))
