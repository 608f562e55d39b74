"""A checkpoint damaged after it was completed is found: resume falls back, a direct load names the damage."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from longboat.checkpoint.dcp import CheckpointError, CheckpointManager, ModelOptimizerState, load_model_weights
from longboat.checkpoint.integrity import MANIFEST, checkpoint_problem
from longboat.tasks.lm_loss import make_lm_loss
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.trainer.trainer import Trainer
from tests.trainer.conftest import RandomTokens, TokenHooks, small_model

FORMAT1 = Path(__file__).resolve().parents[1] / "fixtures" / "format1_run" / "checkpoints" / "step_00000002"


def _save_steps(directory: Path, *steps: int) -> list[Path]:
    model = small_model()
    manager = CheckpointManager(directory)
    return [manager.save(step, {"train": ModelOptimizerState(model, None), "trainer": {"step": step}},
                         task_state={"stats": torch.arange(3.0)}) for step in steps]


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def test_the_manifest_lists_every_file_with_its_size(tmp_path):
    (path,) = _save_steps(tmp_path, 1)
    files = json.loads((path / MANIFEST).read_text())["files"]
    assert set(files) == {".metadata", "__0_0.distcp", "rng_rank0.pt", "task_state.safetensors"}
    assert all(files[name] == (path / name).stat().st_size for name in files)
    assert checkpoint_problem(path) is None


def test_latest_falls_back_past_a_truncated_checkpoint(tmp_path, capsys):
    older, newer = _save_steps(tmp_path, 4, 8)
    _truncate(newer / "__0_0.distcp")
    assert CheckpointManager(tmp_path).latest() == older
    out = capsys.readouterr().out
    assert f"checkpoint {newer} is damaged" in out and "__0_0.distcp is" in out and "falling back" in out
    with pytest.raises(CheckpointError, match=rf"{newer}: damaged checkpoint: __0_0\.distcp is \d+ bytes"):
        load_model_weights(newer, small_model())
    assert load_model_weights(older, small_model()) is False


def test_a_missing_file_is_named(tmp_path):
    (path,) = _save_steps(tmp_path, 1)
    (path / "rng_rank0.pt").unlink()
    with pytest.raises(CheckpointError, match=rf"{path}: damaged checkpoint: missing file rng_rank0\.pt"):
        CheckpointManager(tmp_path).load(path, {"train": ModelOptimizerState(small_model(), None)})


def test_when_every_checkpoint_is_damaged_latest_refuses(tmp_path):
    paths = _save_steps(tmp_path, 1, 2)
    for path in paths:
        (path / ".metadata").unlink()
    with pytest.raises(CheckpointError, match=rf"{paths[-1]}: damaged checkpoint: missing file \.metadata"):
        CheckpointManager(tmp_path).latest()


def test_damage_that_keeps_the_size_is_still_a_checkpoint_error(tmp_path):
    (path,) = _save_steps(tmp_path, 1)
    data = path / "__0_0.distcp"
    data.write_bytes(b"\0" * data.stat().st_size)
    unreadable = rf"{path}: could not be loaded \(UnpicklingError: Unsupported operand 0\)"
    with pytest.raises(CheckpointError, match=unreadable):
        load_model_weights(path, small_model())


def test_format1_checkpoints_are_checked_for_their_dcp_files(tmp_path):
    assert checkpoint_problem(FORMAT1) is None
    old = tmp_path / "step_00000002"
    shutil.copytree(FORMAT1, old)
    (old / "__0_0.distcp").unlink()
    assert checkpoint_problem(old) == "no .distcp data file"
    with pytest.raises(CheckpointError, match="no .distcp data file"):
        load_model_weights(old, small_model(vocab=512))


def test_trainer_resumes_from_the_previous_checkpoint(tmp_path, capsys):
    def trainer(steps: int) -> Trainer:
        cfg = TrainerConfig(steps=steps, micro_batch_size=4, log_every=1, eval_every=0, num_workers=0,
                            tensorboard=False, optimizer={"lr": 1e-2})
        return Trainer(cfg, CheckpointConfig(every=2, export=False), tmp_path, small_model(), make_lm_loss(False),
                       RandomTokens(64, 16, 128), RandomTokens(8, 16, 128), flops_per_unit=1e5, hooks=TokenHooks())

    trainer(4).fit()
    newest = tmp_path / "checkpoints" / "step_00000004"
    _truncate(newest / "__0_0.distcp")
    resumed = trainer(4)
    assert resumed.resume()
    assert resumed.step == 2
    out = capsys.readouterr().out
    assert f"checkpoint {newest} is damaged" in out and "resumed from" in out and "step_00000002" in out
