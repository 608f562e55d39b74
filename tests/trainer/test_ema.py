import pytest
import torch

from longboat.trainer.config import EMAConfig
from longboat.trainer.ema import EMA
from tests.trainer.conftest import small_model


def test_ema_follows_the_weights_and_swaps_in_and_out():
    model = small_model()
    ema = EMA(model, EMAConfig(decay=0.5, every=2, warmup_steps=2))
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(1)  # not a multiple of `every`: skipped
    assert all(torch.equal(ema.shadow[n], start[n]) for n in start)
    ema.update(2)  # within warm-up: copies
    assert all(torch.equal(ema.shadow[n], start[n] + 1) for n in start)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(4)  # halfway to the weights
    for n, p in model.named_parameters():
        torch.testing.assert_close(ema.shadow[n], start[n] + 1.5)
    with ema.swapped_in():
        for n, p in model.named_parameters():
            torch.testing.assert_close(p, start[n] + 1.5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p, start[n] + 2)


def test_ema_skips_frozen_parameters():
    model = small_model()
    model.tok_embeddings.weight.requires_grad_(False)
    assert "tok_embeddings.weight" not in EMA(model, EMAConfig()).shadow


def test_ema_config_is_validated():
    with pytest.raises(ValueError):
        EMAConfig(decay=1.0)
