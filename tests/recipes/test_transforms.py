"""Model transforms applied in one place: the built model, what trains, the plain weights exports hold, a
checkpoint's model folded back, and the records a resume compares; and the typed ``model:`` source."""

from __future__ import annotations

import pytest
import torch
import yaml

from longboat.config.base import ConfigError
from longboat.models.lora import LoRALinear, is_lora_name
from longboat.recipes.config import ModelSource, resolve
from longboat.recipes.transforms import (
    build_model, describe_transforms, fold_model, folded_records, plain_weights, trainable_groups,
)

MODEL = {"arch": "decoder", "preset": "tiny", "vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4,
         "n_kv_heads": 2, "ffn_dim": 64, "max_seq_len": 16}
LORA = {"rank": 2, "alpha": 4, "targets": ["wq", "wv"]}


def run(lora=LORA, param_groups=(), model=MODEL):
    raw = {"run_dir": "unused", "model": model, "train": {"steps": 1, "param_groups": list(param_groups)},
           "data": {"tokenizer": "t", "paths": ["p"], "seq_len": 8}}
    if lora is not None:
        raw["lora"] = lora
    return resolve(raw, from_data=False)


def test_lora_is_applied_when_built_and_only_its_adapters_train():
    resolved = run()
    assert [t.key for t in resolved.transforms] == ["lora"] and describe_transforms(resolved) == " · LoRA rank 2"
    model = build_model(resolved)
    assert sum(isinstance(m, LoRALinear) for m in model.modules()) == 4  # wq and wv of two layers
    (group,) = trainable_groups(resolved, model)
    assert group.names and all(is_lora_name(n) for n in group.names)
    assert len(group.names) == 8
    meta = build_model(resolved, "meta")
    assert all(p.is_meta for p in meta.parameters()) and any(isinstance(m, LoRALinear) for m in meta.modules())


def test_param_rules_apply_on_top_of_the_transforms_groups():
    resolved = run(param_groups=[{"match": "layers.0.*", "lr_scale": 0}, {"match": "*", "lr_scale": 0.5}])
    model = build_model(resolved)
    groups = trainable_groups(resolved, model)
    trained = [n for g in groups for n in g.names]
    assert trained and all(n.startswith("layers.1.") and is_lora_name(n) for n in trained)
    assert {g.lr_scale for g in groups} == {0.5}


def test_plain_weights_and_a_folded_model_are_the_plain_architecture_computing_the_same():
    resolved = run()
    model = build_model(resolved)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 0.5)  # B starts at zero: make the adapters matter
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapted = model(tokens)
    plain = plain_weights(resolved, model.state_dict())
    base = run(lora=None).spec.build(resolved.model)
    assert plain.keys() == base.state_dict().keys()
    base.load_state_dict(plain)
    fold_model(resolved, model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(base(tokens), adapted, rtol=0, atol=1e-5)
        torch.testing.assert_close(model(tokens), adapted, rtol=0, atol=1e-5)
    assert folded_records(resolved) == {"lora": resolved.cfg.lora.model_dump(mode="json")}
    assert folded_records(run(lora=None)) == {} and run(lora=None).transforms == []


def test_lora_refuses_tensor_parallelism_by_name():
    (transform,) = run().transforms
    transform.check_parallel(1)
    with pytest.raises(ConfigError, match=r"lora: LoRA does not combine with tensor parallelism \(parallel.tp=2\)"):
        transform.check_parallel(2)


def test_model_source_is_typed():
    source = ModelSource(arch="decoder", preset="tiny", n_layers=3, attention={"kind": "x"})
    assert source.fields == {"n_layers": 3, "attention": {"kind": "x"}} and source.hf is None
    assert source.model_dump(mode="json") == {"arch": "decoder", "preset": "tiny", "n_layers": 3,
                                              "attention": {"kind": "x"}}
    arch, fields = ModelSource(n_layers=3).resolve()  # the default architecture, no preset
    assert arch == "decoder" and fields == {"n_layers": 3}
    arch, fields = ModelSource(arch="decoder", preset="tiny", n_layers=3).resolve()
    assert fields["n_layers"] == 3 and "d_model" in fields  # the preset's other fields stay
    with pytest.raises(ConfigError, match="model.hf gives the architecture; drop model.arch and model.preset"):
        run(model={"hf": "somewhere", "preset": "tiny"})


def test_a_saved_config_names_the_expanded_model_without_empty_sources():
    resolved = run()
    saved = yaml.safe_load(resolved.to_yaml())
    assert saved["model"]["arch"] == "decoder" and not {"preset", "hf"} & set(saved["model"])
    assert saved["model"]["n_layers"] == 2 and saved["lora"]["rank"] == 2
    again = resolve(saved, from_data=False)
    assert again.model == resolved.model and again.source.hf is None
