"""Each bad value that used to end in a traceback now ends in one line naming the key (``train --check``)."""

import pytest

from longboat.cli.main import main
from tests.conftest import REPO, tiny_run_args


@pytest.mark.parametrize("override, message", [
    ("train.optimizer.lr=-1", "'train.optimizer.lr': Input should be greater than 0"),
    ("train.threads=-2", "'train.threads': Input should be greater than 0"),
    ("train.optimizer.weight_decay=-0.1", "'train.optimizer.weight_decay': Input should be greater than or equal"),
    ("data.split=abc", "'data.split': Value error, split 'abc': expected up to three non-negative numbers"),
    ("data.split=0,0,0", "split '0,0,0': the weights sum to zero"),
    ("train.ema.decay=1", "'train.ema.decay': Input should be less than 1"),
    ("parallel.timeout_minutes=0", "'parallel.timeout_minutes': Input should be greater than 0"),
    ("train.device=tpu", "train.device=tpu, but this machine's accelerator is none"),
])
def test_bad_values_fail_in_one_line(corpus, tmp_path, capsys, override, message):
    args = tiny_run_args(tmp_path / "run", corpus)
    code = main(["train", str(REPO / args[1]), *args[2:], override, "--check"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("inherit", ["5", "[1, 2]", "{a: b}", "''"])
def test_inherit_must_name_configs(tmp_path, capsys, inherit):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"inherit: {inherit}\nrun_dir: r\ntrain: {{steps: 1}}\n")
    assert main(["train", str(cfg), "--check"]) == 2
    assert "'inherit' must be a config path or a list of them" in capsys.readouterr().err


def test_models_lists_a_preset_whose_inputs_are_made_first(capsys):
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (vla,) = [line for line in lines if line.split()[:2] == ["smollm2", "flow_vla"]]
    assert "(needs runs/smollm2-135m-instruct: not a Hugging Face checkpoint" in vla
    assert any(line.split()[:2] == ["tiny", "dit"] for line in lines)
