"""ModelSpec.hooks: what the engine asks of a model is declared by its spec, and a module no spec registers has none."""

from __future__ import annotations

import torch
from torch import nn

from longboat.distributed.layout_checks import expert_modules, expert_sets
from longboat.models import build_model
from longboat.models.contracts import NO_HOOKS
from longboat.models.registry import get_model, hooks_of
from tests.distributed.train_worker import MODELS


def test_unregistered_module_declares_nothing():
    assert hooks_of(nn.Linear(2, 2)) is NO_HOOKS
    assert expert_modules(nn.Linear(2, 2)) == [] and expert_sets(nn.Linear(2, 2)) is None


def test_decoder_spec_declares_its_hooks_and_expert_sets():
    model = build_model("decoder", MODELS["qwen3moe"])
    hooks = hooks_of(model)
    assert hooks is get_model("decoder").hooks and hooks.experts is not None
    experts = expert_modules(model)
    assert experts and all(hooks.experts.n_experts(m) == MODELS["qwen3moe"]["moe"]["n_experts"] for m in experts)
    assert not any(hooks.experts.reads_local_shards(m) for m in experts)  # unsharded: plain forward
    assert expert_modules(model, model.layers[-1]) == [m for m in model.layers[-1].modules() if m in experts]
    model.train()
    model(torch.randint(0, model.cfg.vocab_size, (2, 8)))
    assert set(hooks.aux(model)) >= {"loss", "load", "dropped"}
    hooks.after_optimizer_step(model, None)


def test_a_wrapper_subclass_keeps_its_models_hooks():
    model = build_model("decoder", MODELS["tied"])
    model.__class__ = type("Wrapped", (type(model),), {})  # as FSDP2 re-classes a sharded module
    assert hooks_of(model) is get_model("decoder").hooks


def test_dense_decoder_has_no_expert_sets_and_no_aux():
    model = build_model("decoder", MODELS["tied"])
    assert expert_modules(model) == []
    model(torch.randint(0, model.cfg.vocab_size, (2, 8)))
    assert hooks_of(model).aux(model) is None
