"""A language model from outside the package (``tests/plugins/biased_lm.py``) that meets the language-model contract
and takes an extra input from the batch trains under ``task: pretrain`` and ``task: sft`` through the real command
line; a model config that does not meet the contract is refused naming the missing fields."""

import pytest
import torch
import yaml

from longboat.config.base import ConfigError
from longboat.models.contracts import require_language_model
from longboat.trainer.metrics import read_metrics
from tests.conftest import REPO, run_longboat

PLUGIN = REPO / "tests" / "plugins" / "biased_lm.py"
MODEL = {"arch": "biased_lm", "vocab_size": 512, "max_seq_len": 128}
TRAIN = {"steps": 4, "micro_batch_size": 4, "log_every": 1, "eval_every": 0, "eval_batches": 1, "num_workers": 0,
         "threads": 1, "tensorboard": False, "dtype": "fp32"}


def test_a_config_without_the_contract_is_refused_naming_the_missing_fields():
    class Policy:
        vocab_size = 4

    with pytest.raises(ConfigError, match="task 'sft'.*Policy lacks max_seq_len, flops_per_token"):
        require_language_model(Policy(), "sft")


def test_the_model_inputs_hook_feeds_the_loss():
    import tests.plugins.biased_lm  # noqa: F401  (registers the model)
    from longboat.models.registry import get_model, hooks_for_config
    from longboat.tasks.lm_loss import make_lm_loss

    spec = get_model("biased_lm")
    cfg = spec.config(**{k: v for k, v in MODEL.items() if k != "arch"})
    loss = make_lm_loss(False, extra_inputs=hooks_for_config(cfg).model_inputs)
    batch = {"tokens": torch.randint(0, 512, (2, 8)), "labels": torch.randint(0, 512, (2, 8))}
    args, kwargs = loss.model_inputs(batch)
    assert set(kwargs) == {"token_bias"} and torch.equal(kwargs["token_bias"], (batch["tokens"] % 2).float())
    assert loss(spec.build(cfg), batch).count == 16


def _train(tmp_path, cfg: dict) -> list[dict]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_longboat("train", str(path), check=True, timeout=600)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows if "loss" in r][-1] == TRAIN["steps"]
    return rows


@pytest.mark.slow
def test_trains_under_pretrain(tmp_path, corpus):
    tokenizer, prefix = corpus
    _train(tmp_path, {
        "task": "pretrain", "run_dir": str(tmp_path / "run"), "plugins": [str(PLUGIN)], "model": MODEL,
        "data": {"tokenizer": str(tokenizer), "paths": [str(prefix)], "seq_len": 64},
        "train": TRAIN, "checkpoint": {"every": 0, "export": False},
    })


@pytest.mark.slow
def test_trains_under_sft(tmp_path):
    cfg = yaml.safe_load((REPO / "configs" / "sft" / "tiny.yaml").read_text())
    cfg.update(run_dir=str(tmp_path / "run"), plugins=[str(PLUGIN)], model=MODEL, train=TRAIN,
               checkpoint={"every": 0, "export": False})
    cfg["data"]["tokenizer"] = str(REPO / cfg["data"]["tokenizer"])
    for source in cfg["data"]["sources"]:
        source["path"] = str(REPO / source["path"])
    _train(tmp_path, cfg)
