import pytest
import torch
from torch.utils.data import Dataset

from longboat.models import build_model
from longboat.models.llm import load_preset
from longboat.trainer.hooks import TrainerHooks


class TokenHooks(TrainerHooks):
    """A language-model loss counts tokens."""

    unit = "tokens"


class RandomTokens(Dataset):
    """Deterministic random token samples, pre-shifted as the data layer delivers them."""

    def __init__(self, n: int, seq_len: int, vocab: int):
        self.n, self.seq_len, self.vocab = n, seq_len, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        # A learnable pattern: every token repeats the one two places back.
        head = torch.randint(0, self.vocab, (2,), generator=g)
        x = head.repeat((self.seq_len + 2) // 2)[: self.seq_len + 1]
        return {"tokens": x[:-1], "labels": x[1:].clone(), "position_ids": torch.arange(self.seq_len)}


def small_model(vocab: int = 128, seed: int = 0):
    torch.manual_seed(seed)
    cfg = dict(load_preset("tiny"), vocab_size=vocab, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn_dim=64)
    return build_model("decoder", cfg)


@pytest.fixture
def random_tokens():
    return RandomTokens
