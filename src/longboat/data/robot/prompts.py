"""``PromptTokens``: a robot task's prompt as a policy reads it, right-padded token ids and a mask of fixed length;
shared by the policy task (training samples) and a served policy (requests)."""

from __future__ import annotations

import torch

from longboat.data.tokenizer import Tokenizer


class PromptTokens:
    """Task strings (with ``suffix`` appended where they lack it, as SmolVLA's newline) -> right-padded token ids [L]
    and a mask [L] of the real tokens (truncated to L)."""

    def __init__(self, tokenizer: Tokenizer, length: int, suffix: str = ""):
        self.tokenizer = tokenizer
        self.suffix = suffix
        pad = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else self.tokenizer.eos_id
        self.pad_id = pad if pad is not None else 0
        self.length = length
        self._cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # a dataset has few distinct prompts

    def __call__(self, text: str) -> tuple[torch.Tensor, torch.Tensor]:
        if text not in self._cache:
            full = text if text.endswith(self.suffix) else text + self.suffix
            ids = self.tokenizer.encode(full)[: self.length]
            tokens = torch.full((self.length,), self.pad_id, dtype=torch.int64)
            tokens[: len(ids)] = torch.tensor(ids, dtype=torch.int64)
            mask = torch.zeros(self.length, dtype=torch.bool)
            mask[: len(ids)] = True
            self._cache[text] = tokens, mask
        return self._cache[text]

    def batch(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self(t) for t in texts]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
