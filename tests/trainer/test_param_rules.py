"""``train.param_groups``: rules split the task's groups, scale their learning rates, freeze at 0, and fail early on
a match that selects nothing; end to end, a frozen component stays bitwise unchanged in pretraining and SFT."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from longboat.config.base import ConfigError, validate
from longboat.recipes import train
from longboat.recipes.config import load_run_config
from longboat.trainer.config import TrainerConfig
from longboat.trainer.optim import OptimizerConfig, ParamGroup, build_optimizer, freeze_outside
from longboat.trainer.param_rules import ParamRule, apply_param_rules
from tests.conftest import REPO, run_longboat, tiny_run_args
from tests.trainer.conftest import small_model

LAYER0 = "layers.0.*"


def rules(*pairs) -> list[ParamRule]:
    return [ParamRule(match=m, lr_scale=s) for m, s in pairs]


def lrs(optimizer, model) -> dict[str, float]:
    """Each parameter's learning rate before the schedule's multiplier, by name."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return {by_id[id(p)]: g.get("initial_lr", g["lr"]) for g in optimizer.param_groups for p in g["params"]}


def test_no_rules_leave_the_task_groups_alone():
    model = small_model()
    task = [ParamGroup(["norm.weight"], 0.3)]
    assert apply_param_rules(model, None, []) is None
    assert apply_param_rules(model, task, []) is task


def test_scale_freeze_and_first_match_wins():
    model = small_model()
    groups = apply_param_rules(model, None, rules((LAYER0, 0), ("layers.*", 0.5), ("layers.1.*", 0.1)))
    frozen = freeze_outside(model, groups)
    assert frozen == sum(p.numel() for n, p in model.named_parameters() if n.startswith("layers.0."))
    assert not any(p.requires_grad for n, p in model.named_parameters() if n.startswith("layers.0."))
    opt = build_optimizer(model, OptimizerConfig(lr=1e-3), groups)
    lr = lrs(opt, model)
    assert not any(n.startswith("layers.0.") for n in lr)
    assert sorted({lr[n] for n in lr if n.startswith("layers.1.")}) == pytest.approx([5e-4])  # "layers.*" came first
    assert lr["tok_embeddings.weight"] == pytest.approx(1e-3)


def test_rules_multiply_the_task_scale_and_keep_its_decay():
    model = small_model()
    names = [n for n, _ in model.named_parameters()]
    task = [ParamGroup([n for n in names if n.startswith("layers.")], 0.2, 0.0),
            ParamGroup([n for n in names if not n.startswith("layers.")])]
    groups = apply_param_rules(model, task, rules(("layers.1.*", 0.5)))
    assert [(g.lr_scale, g.weight_decay) for g in groups] == [(0.2, 0.0), (pytest.approx(0.1), 0.0), (1.0, None)]
    assert groups[1].names == [n for n in names if n.startswith("layers.1.")]


def test_a_match_that_selects_nothing_names_it_and_the_parameters():
    with pytest.raises(ConfigError, match=r"param_groups\[1\]\.match: 'vision\.\*' selects no parameter.*"
                                          r"tok_embeddings\.weight"):
        apply_param_rules(small_model(), None, rules(("norm.*", 1), ("vision.*", 0.1)))
    with pytest.raises(ConfigError, match="nothing would train"):
        apply_param_rules(small_model(), None, rules(("*", 0)))


def test_config_validation():
    cfg = validate(TrainerConfig, {"steps": 1, "param_groups": [{"match": "layers.0.*", "lr_scale": 0}]}, "run")
    assert cfg.param_groups == rules((LAYER0, 0))
    for bad in ({"match": "x", "lr_scale": -1}, {"match": "", "lr_scale": 1}, {"match": "x", "lr_sacle": 1}):
        with pytest.raises(ConfigError):
            validate(TrainerConfig, {"steps": 1, "param_groups": [bad]}, "run")


class RecordingTrainer(train.Trainer):
    """Keeps the weights as training starts and the optimizer's learning rates."""

    runs: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        start = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        RecordingTrainer.runs.append((self, start, lrs(self.optimizer, self.model)))


def trained(monkeypatch, resolved):
    """``(weights at the start, at the end, learning rate by parameter name)`` of a run."""
    RecordingTrainer.runs = []
    monkeypatch.setattr(train, "Trainer", RecordingTrainer)
    train.run(resolved)
    trainer, start, lr = RecordingTrainer.runs[0]
    return start, {n: p.detach() for n, p in trainer.model.named_parameters()}, lr


def check_frozen_and_halved(start, end, lr, base_lr):
    for name, before in start.items():
        if name.startswith("layers.0."):
            assert torch.equal(before, end[name]), name
            assert name not in lr
        else:
            assert not torch.equal(before, end[name]), name
    assert sorted({lr[n] for n in lr if n.startswith("layers.1.")}) == pytest.approx([base_lr / 2])
    assert lr["tok_embeddings.weight"] == pytest.approx(base_lr)


RULES = '[{match: "layers.0.*", lr_scale: 0}, {match: "layers.1.*", lr_scale: 0.5}]'


def test_pretraining_freezes_and_scales_a_component(corpus, tmp_path, monkeypatch):
    args = tiny_run_args(tmp_path / "run", corpus, "train.steps=3", "checkpoint.export=false",
                         "train.schedule.warmup_steps=0", f"train.param_groups={RULES}")
    resolved = load_run_config(REPO / args[1], args[2:])
    start, end, lr = trained(monkeypatch, resolved)
    check_frozen_and_halved(start, end, lr, resolved.cfg.train.optimizer.lr)


def test_sft_freezes_and_scales_a_component(tmp_path, monkeypatch):
    tokenizer = REPO / "tests" / "fixtures" / "sft" / "tokenizer"
    resolved = load_run_config(REPO / "configs" / "sft" / "tiny.yaml", [
        f"run_dir={tmp_path / 'run'}", f"data.tokenizer={tokenizer}", f"data.sources=[{tokenizer.parent / 'chat.jsonl'}]",
        "model.d_model=64", "model.ffn_dim=128", "train.threads=1", "train.tensorboard=false", "train.steps=3",
        "train.eval_every=0", "checkpoint.every=0", "checkpoint.export=false", f"train.param_groups={RULES}"])
    start, end, lr = trained(monkeypatch, resolved)
    check_frozen_and_halved(start, end, lr, resolved.cfg.train.optimizer.lr)


@pytest.mark.parametrize("rule, message", [
    ('[{match: "vision.*", lr_scale: 0.1}]', "train.param_groups[0].match: 'vision.*' selects no parameter"),
    ('[{match: "layers.0.*", lr_scale: -1}]', "lr_scale"),
    ('[{match: "layers.0.*", lr_sclae: 0}]', "lr_sclae"),
])
def test_check_reports_a_bad_rule_on_one_line(corpus, tmp_path, rule, message):
    proc = run_longboat(*tiny_run_args(tmp_path, corpus, f"train.param_groups={rule}"), "--check")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in proc.stderr, proc.stderr  # one error line, its problems below it
    assert "Traceback" not in proc.stderr


def test_resume_refuses_changed_groups(corpus, tmp_path):
    base = tiny_run_args(tmp_path, corpus, "train.steps=1", "checkpoint.export=false")
    run_longboat(*base, f"train.param_groups={RULES}", check=True)
    proc = run_longboat(*base, "--check")
    assert proc.returncode != 0 and "train.param_groups" in proc.stderr, proc.stderr
    assert run_longboat(*base, f"train.param_groups={RULES}", "--check").returncode == 0


def test_under_lora_rules_act_on_the_adapters():
    from longboat.models.lora import LoRAConfig, apply_lora, is_lora_name
    from longboat.recipes.lora import lora_param_groups

    model = small_model()
    apply_lora(model, LoRAConfig(rank=2))
    groups = apply_param_rules(model, lora_param_groups(model, None), rules((LAYER0, 0)))
    freeze_outside(model, groups)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(is_lora_name(n) and n.startswith("layers.1.") for n in trainable)
