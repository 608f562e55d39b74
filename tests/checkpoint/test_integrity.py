"""A checkpoint damaged after it was completed is found: resume falls back, a direct load names the damage."""

import json
import shutil
import zlib
from pathlib import Path

import pytest
import torch

from longboat.checkpoint.dcp import CheckpointError, CheckpointManager, ModelOptimizerState, load_model_weights
from longboat.checkpoint.integrity import MANIFEST, checkpoint_problem
from longboat.cli.main import main
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


def _flip_byte(file: Path) -> None:
    """Damage that keeps the size: one bit of one byte in the middle of the file."""
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))


def _drop_checksums(path: Path) -> None:
    """Make ``path``'s manifest as it was written before checksums were recorded."""
    manifest = json.loads((path / MANIFEST).read_text())
    del manifest["checksums"]
    (path / MANIFEST).write_text(json.dumps(manifest))


def test_the_manifest_lists_every_file_with_its_size(tmp_path):
    (path,) = _save_steps(tmp_path, 1)
    files = json.loads((path / MANIFEST).read_text())["files"]
    assert set(files) == {".metadata", "__0_0.distcp", "rng_rank0.pt", "task_state.safetensors"}
    assert all(files[name] == (path / name).stat().st_size for name in files)
    checksums = json.loads((path / MANIFEST).read_text())["checksums"]
    assert checksums == {name: f"crc32:{zlib.crc32((path / name).read_bytes()):08x}" for name in files}
    assert checkpoint_problem(path) is None


def test_latest_falls_back_past_a_checkpoint_with_a_flipped_byte(tmp_path, capsys):
    older, newer = _save_steps(tmp_path, 4, 8)
    _flip_byte(newer / "__0_0.distcp")
    assert CheckpointManager(tmp_path).latest() == older
    out = capsys.readouterr().out
    assert f"checkpoint {newer} is damaged" in out and "__0_0.distcp fails its checksum" in out
    with pytest.raises(CheckpointError, match=rf"{newer}: damaged checkpoint: __0_0\.distcp fails its checksum"):
        load_model_weights(newer, small_model())


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


def test_a_manifest_without_checksums_is_checked_by_size_and_still_loads(tmp_path):
    older, newer = _save_steps(tmp_path, 1, 2)
    for path in (older, newer):
        _drop_checksums(path)
    assert checkpoint_problem(newer) is None and CheckpointManager(tmp_path).latest() == newer
    assert load_model_weights(newer, small_model()) is False
    _truncate(older / "__0_0.distcp")
    assert "__0_0.distcp is" in checkpoint_problem(older)


def test_damage_that_keeps_the_size_of_an_old_manifest_is_still_a_checkpoint_error(tmp_path):
    (path,) = _save_steps(tmp_path, 1)
    _drop_checksums(path)
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


@pytest.mark.parametrize("damage", [_truncate, _flip_byte])
def test_trainer_resumes_from_the_previous_checkpoint(tmp_path, capsys, damage):
    def trainer(steps: int) -> Trainer:
        cfg = TrainerConfig(steps=steps, micro_batch_size=4, log_every=1, eval_every=0, num_workers=0,
                            tensorboard=False, optimizer={"lr": 1e-2})
        return Trainer(cfg, CheckpointConfig(every=2, export=False), tmp_path, small_model(), make_lm_loss(False),
                       RandomTokens(64, 16, 128), RandomTokens(8, 16, 128), flops_per_unit=1e5, hooks=TokenHooks())

    trainer(4).fit()
    newest = tmp_path / "checkpoints" / "step_00000004"
    damage(newest / "__0_0.distcp")
    resumed = trainer(4)
    assert resumed.resume()
    assert resumed.step == 2
    out = capsys.readouterr().out
    assert f"checkpoint {newest} is damaged" in out and "resumed from" in out and "step_00000002" in out


def test_checkpoint_verify_names_the_damaged_file_and_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    older, newer = _save_steps(run / "checkpoints", 2, 4)
    assert main(["checkpoint", "verify", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"ok       {older}: 4 files, sizes and checksums", f"ok       {newer}: 4 files, sizes and checksums"]

    _flip_byte(older / "rng_rank0.pt")
    assert main(["checkpoint", "verify", str(run)]) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith(f"DAMAGED  {older}: rng_rank0.pt fails its checksum")
    assert captured.out.splitlines()[1].startswith(f"ok       {newer}")
    assert captured.err.startswith("error: 1 damaged checkpoint(s): ") and f"{older}: rng_rank0.pt" in captured.err

    _drop_checksums(newer)
    assert main(["checkpoint", "verify", str(newer)]) == 0
    assert capsys.readouterr().out == f"ok       {newer}: 4 files, sizes only (written before checksums were recorded)\n"
    assert main(["checkpoint", "verify", str(FORMAT1)]) == 0
    assert "no file list (format 1)" in capsys.readouterr().out
    assert main(["checkpoint", "verify", str(tmp_path)]) == 2
    assert "neither a checkpoint nor a run directory" in capsys.readouterr().err
