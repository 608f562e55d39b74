"""LoRA adapters: the initial model is the base, merging changes nothing, dropout touches only the adapter path,
targets that cannot be adapted fail by name, and the PEFT layout loads onto the transformers model."""

from __future__ import annotations

import json
import math

import peft
import pytest
import torch
import transformers
from torch import nn

from longboat.config.base import ConfigError
from longboat.models import build_model, get_model
from longboat.models.llm import load_preset
from longboat.models.llm.hf import load_hf_model
from longboat.models.lora import LoRAConfig, LoRALinear, apply_lora, is_lora_name, merge_lora
from longboat.models.peft_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from longboat.recipes.lora import LoRATransform, save_run_adapter

TOKENS = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))


def decoder(seed: int = 0, **fields):
    torch.manual_seed(seed)
    cfg = dict(load_preset("tiny"), vocab_size=128, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn_dim=64,
               max_seq_len=32, **fields)
    return build_model("decoder", cfg).eval()


def randomise_adapters(model: nn.Module, seed: int = 1) -> None:
    """Non-zero B, so the adapters change the function and a wrong merge or mapping shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_lora_name(name):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def test_initial_adapted_model_equals_the_base_and_only_adapters_are_added():
    model = decoder(tie_embeddings=False)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        expected = model(TOKENS)
    adapted = apply_lora(model, LoRAConfig(rank=4, alpha=8))
    assert len(adapted) == 2 * 7 and "output" not in adapted  # wq wk wv wo w1 w2 w3 per layer
    with torch.no_grad():
        assert torch.equal(model(TOKENS), expected)
    state = model.state_dict()
    assert {k for k in state if not is_lora_name(k)} == set(base_state)
    assert all(torch.equal(state[k], v) for k, v in base_state.items())  # the base tensors under their names
    wq = model.layers[0].attention.wq
    assert isinstance(wq, LoRALinear) and wq.lora_A.shape == (4, 32) and wq.lora_B.shape == (32, 4)
    assert wq.lora_A.abs().sum() > 0 and wq.lora_B.abs().sum() == 0  # PEFT's init: kaiming A, zero B
    assert wq.scale == 2.0 and LoRAConfig(rank=4, alpha=8, rslora=True).scale == 4.0


def test_merge_equals_unmerged_logits_for_modules_and_state_dicts():
    model = decoder(qkv_bias=True)
    cfg = LoRAConfig(rank=4, alpha=6, targets=["wq", "wv", "feed_forward.w2"])
    apply_lora(model, cfg)
    randomise_adapters(model)
    with torch.no_grad():
        adapted = model(TOKENS)
        base = decoder(qkv_bias=True)(TOKENS)
    assert (adapted - base).abs().max() > 1e-2  # the adapters matter
    merged_sd, adapters = LoRATransform(cfg).fold_state(model.state_dict())
    assert sorted(adapters) == sorted(n for n, _ in model.named_parameters() if is_lora_name(n))
    merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert type(model.layers[1].attention.wq) is nn.Linear and model.layers[1].attention.wq.bias is not None
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), adapted, rtol=0, atol=1e-5)
    assert merged_sd.keys() == model.state_dict().keys()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(merged_sd[name], value, rtol=0, atol=0, msg=name)


def test_dropout_applies_to_the_adapter_input_only():
    model = decoder()
    apply_lora(model, LoRAConfig(rank=4, dropout=0.5))
    model.train()
    with torch.no_grad():
        base = decoder()(TOKENS)
        assert torch.equal(model(TOKENS), base)  # B = 0: dropout on the adapter path changes nothing
        randomise_adapters(model)
        one, two = model(TOKENS), model(TOKENS)
        assert not torch.equal(one, two)  # the adapter path is dropped at random
        model.eval()
        assert torch.equal(model(TOKENS), model(TOKENS))


def test_targets_that_cannot_be_adapted_fail_by_name():
    with pytest.raises(ConfigError, match=r"'tok_embeddings' names Embedding modules, not nn.Linear; .*"
                                          r"end in: w1, w2, w3, wk, wo, wq, wv \(embeddings and the grouped experts"):
        apply_lora(decoder(), LoRAConfig(targets=["wq", "tok_embeddings"]))
    with pytest.raises(ConfigError, match=r"lora.targets: 'q_proj' matches no module; .*end in: w1, w2"):
        apply_lora(decoder(), LoRAConfig(targets=["q_proj"]))
    moe = decoder(moe={"d_model": 32, "n_experts": 4, "top_k": 2, "expert_ffn_dim": 32})
    with pytest.raises(ConfigError, match=r"'experts' names GroupedExperts modules, not nn.Linear"):
        apply_lora(moe, LoRAConfig(targets=["experts"]))
    adapted = apply_lora(moe, LoRAConfig())  # defaults: attention projections (MoE layers have no w1..w3 Linear)
    assert adapted and all(n.rpartition(".")[2] in ("wq", "wk", "wv", "wo") for n in adapted)
    with pytest.raises(ValueError):
        LoRAConfig(rank=0)


def test_adapters_built_on_meta_are_initialised_with_the_model():
    from longboat.distributed.parallelize import materialize

    with torch.device("meta"):
        model = get_model("decoder").build(decoder().cfg)
    apply_lora(model, LoRAConfig(rank=4))
    materialize(model, torch.device("cpu"))
    for module in model.modules():
        if isinstance(module, LoRALinear):
            bound = 1 / math.sqrt(module.in_features)  # kaiming-uniform with a=sqrt(5), as nn.Linear and PEFT
            assert module.lora_A.abs().max() <= bound and module.lora_A.std() > bound / 3
            assert torch.equal(module.lora_B, torch.zeros_like(module.lora_B))


# ---- PEFT ---------------------------------------------------------------------------------------------------

HF_BASE = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=48, max_position_embeddings=64, rms_norm_eps=1e-6)


def save_tiny_hf(path, model_type: str, **kwargs):
    from tests.models.llm.hf.test_io import make_hf

    make_hf(model_type, dict(HF_BASE, **kwargs)).save_pretrained(path)
    return path


@pytest.mark.parametrize("model_type, targets, expected_targets", [
    ("qwen2", None, ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]),
    ("llama", ["layers.1.attention.wv", "w3"], ["model.layers.1.self_attn.v_proj", "model.layers.0.mlp.up_proj",
                                                 "model.layers.1.mlp.up_proj"]),
])
def test_peft_adapter_loads_onto_the_transformers_model_with_equal_logits(tmp_path, model_type, targets,
                                                                          expected_targets):
    hf_dir = save_tiny_hf(tmp_path / "hf", model_type, tie_word_embeddings=model_type == "qwen2")
    ours, model_cfg, _ = load_hf_model(hf_dir)
    cfg = LoRAConfig(rank=4, alpha=12, targets=targets, rslora=model_type == "llama")
    apply_lora(ours, cfg)
    randomise_adapters(ours)
    merged, adapters = LoRATransform(cfg).fold_state(ours.state_dict())
    out = save_run_adapter(tmp_path / "run" / "adapter", adapters, merged, cfg, get_model("decoder"), model_cfg,
                           str(hf_dir))
    meta = json.loads((out / ADAPTER_CONFIG).read_text())
    assert meta["peft_type"] == "LORA" and meta["task_type"] == "CAUSAL_LM" and meta["r"] == 4
    assert meta["lora_alpha"] == 12 and meta["use_rslora"] == (model_type == "llama") and meta["bias"] == "none"
    assert meta["base_model_name_or_path"] == str(hf_dir) and sorted(meta["target_modules"]) == sorted(expected_targets)
    assert (out / ADAPTER_WEIGHTS).is_file()

    base = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    peft_model = peft.PeftModel.from_pretrained(base, out).eval()
    n_adapted = sum(isinstance(m, peft.tuners.lora.LoraLayer) for m in peft_model.modules())
    assert n_adapted == len(adapters) // 2
    with torch.no_grad():
        theirs = peft_model(TOKENS).logits
        mine = ours(TOKENS)
        assert (mine - transformers.AutoModelForCausalLM.from_pretrained(hf_dir)(TOKENS).logits).abs().max() > 1e-2
    torch.testing.assert_close(theirs, mine, rtol=0, atol=1e-5)


def test_task_groups_restrict_the_adapters_that_train():
    from longboat.recipes.lora import lora_param_groups
    from longboat.trainer.optim import OptimizerConfig, ParamGroup, build_optimizer, freeze_outside

    model = decoder()
    apply_lora(model, LoRAConfig(rank=2, targets=["wq", "w1"]))
    names = [n for n, _ in model.named_parameters()]
    assert lora_param_groups(model, None)[0].names == [n for n in names if is_lora_name(n)]
    # A task that trains layer 1 at half the learning rate and the final norm: only layer 1's adapters train.
    task = [ParamGroup([n for n in names if n.startswith("layers.1.")], lr_scale=0.5), ParamGroup(["norm.weight"])]
    groups = lora_param_groups(model, task)
    assert [g.names for g in groups] == [["layers.1.attention.wq.lora_A", "layers.1.attention.wq.lora_B",
                                          "layers.1.feed_forward.w1.lora_A", "layers.1.feed_forward.w1.lora_B"]]
    assert groups[0].lr_scale == 0.5
    freeze_outside(model, groups)
    optimizer = build_optimizer(model, OptimizerConfig(lr=1e-2), groups)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for n, p in model.named_parameters() if n in groups[0].names}
    model.train()
    model(TOKENS).sum().backward()
    assert {n for n, p in model.named_parameters() if p.grad is not None} == set(groups[0].names)
    with pytest.raises(ConfigError, match="no adapted module lies in the task's parameter groups"):
        lora_param_groups(model, [ParamGroup(["norm.weight"])])
