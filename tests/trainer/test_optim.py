"""The optimizer's parameter groups: no weight decay for norms, biases and embeddings."""

import torch

from longboat.trainer.optim import OptimizerConfig, build_optimizer, param_groups
from tests.trainer.conftest import small_model


def test_no_decay_for_norms_biases_embeddings():
    model = small_model()
    decay, no_decay = param_groups(model, OptimizerConfig(weight_decay=0.1))
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"])
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert "tok_embeddings.weight" in no_decay_names
    assert any("norm" in n for n in no_decay_names)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    opt = build_optimizer(model, OptimizerConfig(lr=1e-3))
    assert isinstance(opt, torch.optim.AdamW)
