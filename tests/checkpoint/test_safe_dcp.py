"""Checkpoints are read without running code: DCP's pickled metadata and non-tensor values included."""

import json
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from longboat.checkpoint.dcp import CheckpointError, CheckpointManager, ModelOptimizerState, load_model_weights
from longboat.checkpoint.integrity import MANIFEST, file_checksum
from longboat.checkpoint.safe_dcp import load_dcp, read_metadata
from longboat.models.llm import Decoder, DecoderConfig
from longboat.models.moe import split_gate_up
from tests.trainer.conftest import small_model

FORMAT1 = Path(__file__).resolve().parents[1] / "fixtures" / "format1_run" / "checkpoints" / "step_00000002"


class Payload:
    """Unpickling this creates ``marker``: proof that the file ran code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    model = small_model(seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    model(torch.randint(0, 128, (2, 8))).float().sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _state(model, optimizer, scheduler, step: int) -> dict:
    return {"train": ModelOptimizerState(model, optimizer), "scheduler": scheduler.state_dict(),
            "trainer": {"step": step, "consumed": 8 * step}}


def _save(tmp_path: Path, step: int = 1) -> Path:
    return CheckpointManager(tmp_path / "checkpoints").save(step, _state(*_trained(), step))


def _record_size(checkpoint: Path, name: str) -> None:
    """Make the manifest agree with a file replaced on purpose, as someone crafting a checkpoint would."""
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    manifest["files"][name] = (checkpoint / name).stat().st_size
    manifest["checksums"][name] = file_checksum(checkpoint / name)
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))


def test_a_checkpoint_round_trips_through_the_safe_reader(tmp_path):
    model, optimizer, scheduler = _trained()
    path = CheckpointManager(tmp_path).save(3, _state(model, optimizer, scheduler, 3))
    fresh_model, fresh_optimizer, fresh_scheduler = _trained(seed=1)
    state = _state(fresh_model, fresh_optimizer, fresh_scheduler, 0)
    CheckpointManager(tmp_path).load(path, state)
    assert state["trainer"] == {"step": 3, "consumed": 24}
    assert state["scheduler"] == scheduler.state_dict()
    for (name, a), b in zip(model.state_dict().items(), fresh_model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    saved, loaded = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    torch.testing.assert_close(saved["state"], loaded["state"], rtol=0, atol=0)


def test_format1_metadata_is_within_the_allow_list():
    metadata = read_metadata(FORMAT1)
    assert any(key.startswith("train.model.") for key in metadata.state_dict_metadata)


def test_metadata_that_would_run_code_is_refused(tmp_path):
    path = _save(tmp_path)
    marker = tmp_path / "ran"
    (path / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    _record_size(path, ".metadata")
    model, optimizer, scheduler = _trained()
    with pytest.raises(CheckpointError, match=r"\.metadata: refused to unpickle builtins\.exec"):
        CheckpointManager(tmp_path / "checkpoints").load(path, _state(model, optimizer, scheduler, 0))
    with pytest.raises(CheckpointError, match=r"\.metadata: refused to unpickle builtins\.exec"):
        load_model_weights(path, model)
    assert not marker.exists()


def test_metadata_with_a_class_outside_dcp_is_refused(tmp_path):
    path = _save(tmp_path)
    metadata = read_metadata(path)
    metadata.planner_data = {"extra": torch.nn.Identity()}  # a harmless class, but not one DCP metadata uses
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    _record_size(path, ".metadata")
    with pytest.raises(CheckpointError, match=r"refused to unpickle torch\.nn\.modules\.linear\.Identity"):
        load_model_weights(path, small_model())


def test_a_non_tensor_value_that_would_run_code_is_not_executed(tmp_path):
    marker = tmp_path / "ran"
    path = CheckpointManager(tmp_path / "checkpoints").save(1, {"trainer": {"step": 1, "extra": Payload(marker)}})
    refused = rf"{path}: refused to load trainer\.extra, a non-tensor value .*GLOBAL exec"
    with pytest.raises(CheckpointError, match=refused):
        CheckpointManager(tmp_path / "checkpoints").load(path, {"trainer": {"step": 0, "extra": None}})
    assert not marker.exists()
    # The same file through DCP's default reader does run the payload: the test above is a real one.
    dcp.load({"trainer": {"step": 0, "extra": None}}, checkpoint_id=path)
    assert marker.exists()


def test_a_plain_dcp_checkpoint_with_a_payload_is_refused(tmp_path):
    marker = tmp_path / "ran"
    dcp.save({"scheduler": {"last_epoch": 1, "hook": Payload(marker)}}, checkpoint_id=tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match=r"refused to load scheduler\.hook, a non-tensor value"):
        load_dcp({"scheduler": {"last_epoch": 0, "hook": None}}, tmp_path / "ckpt")
    assert not marker.exists()


def test_a_checkpoint_with_renamed_tensors_names_the_rename(tmp_path):
    """MoE experts once stored gate and up as w1 and w3; a checkpoint from then names them against w13."""
    cfg = DecoderConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, ffn_dim=64, max_seq_len=16,
                        moe=dict(d_model=32, n_experts=4, top_k=2, expert_ffn_dim=16))
    weights = Decoder(cfg).state_dict()
    w13 = weights.pop("layers.0.feed_forward.experts.w13")
    weights["layers.0.feed_forward.experts.w1"], weights["layers.0.feed_forward.experts.w3"] = \
        (w.contiguous() for w in split_gate_up(w13))
    path = CheckpointManager(tmp_path).save(1, {"train": {"model": weights}})
    with pytest.raises(CheckpointError, match=r"no tensor train\.model\.layers\.0\.feed_forward\.experts\.w13 .*"
                                              r"this model has w13 where the checkpoint has w1, w3"):
        load_model_weights(path, Decoder(cfg))
