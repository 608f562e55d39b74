"""The backbone's layers over the prefix: the decoder's own block, its keys and values returned as outputs, so each
layer is an FSDP2 and activation-checkpointing unit that trains on two gloo ranks as in one process."""

from __future__ import annotations

import json

import pytest
import torch

from longboat.distributed.parallelize import parallel_units
from longboat.models import build_model
from longboat.models.llm import DecoderConfig
from longboat.models.llm.model import Block
from longboat.models.llm.rope import rope_tables
from longboat.models.policy.flow_vla import FLOW_VLA
from longboat.models.policy.flow_vla.prefix import PrefixBlock
from longboat.trainer.metrics import read_metrics
from tests.distributed.conftest import finish, free_ports, start, torchrun
from tests.distributed.policy_worker import STEPS, run_case
from tests.models.policy.flow_vla.test_model import tiny
from tests.tasks.policy_dataset import write_policy_dataset


class Captured:
    """A cache stand-in that records what the attention hands it."""

    def update(self, layer, k, v):
        self.k, self.v = k, v
        return k, v


def test_a_prefix_block_is_the_decoder_block_returning_its_keys_and_values():
    cfg = DecoderConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16,
                        qk_norm=True)
    torch.manual_seed(0)
    block = Block(cfg, 0)
    prefix = PrefixBlock(block)
    assert list(prefix.state_dict()) == list(block.state_dict())  # the same names: checkpoints load unchanged
    x = torch.randn(2, 6, 32)
    cos, sin = (t[:6] for t in rope_tables(16, cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling))
    mask = (torch.rand(2, 1, 6, 6) > 0.3) | torch.eye(6, dtype=torch.bool)
    captured = Captured()
    want, _ = block(x, cos, sin, captured, mask)
    got, k, v = prefix(x, cos, sin, mask)
    assert torch.equal(got, want) and torch.equal(k, captured.k) and torch.equal(v, captured.v)
    assert k.shape == (2, 2, 6, 8)


def test_the_backbone_layers_are_units_under_their_own_names():
    model = build_model("flow_vla", tiny())
    units = {id(unit) for _, _, unit in parallel_units(model, FLOW_VLA.parallel_units)}
    assert all(isinstance(layer, PrefixBlock) and id(layer) in units for layer in model.backbone.layers)
    assert "backbone.layers.1.attention.wk.weight" in model.state_dict()


@pytest.mark.slow
def test_fsdp2_with_checkpointing_per_backbone_layer_trains_as_one_process(tmp_path):
    dataset = str(write_policy_dataset(tmp_path / "ds"))
    (port,) = free_ports(1)
    log = tmp_path / "two.log"
    two = start(torchrun(2, port, "tests/distributed/policy_worker.py", str(tmp_path), dataset, "flow_vla:fsdp"), log)
    threads = torch.get_num_threads()
    try:
        run_case(tmp_path, dataset, "flow_vla:single")  # the reference, while the ranks run
    finally:
        torch.set_num_threads(threads)
        out = finish(two, log, timeout=300)
    assert two.returncode == 0, out[-6000:]
    units = json.loads((tmp_path / "flow_vla_fsdp" / "units.json").read_text())
    layers = ["backbone.layers.0", "backbone.layers.1"]
    assert set(layers) <= set(units["fsdp"]) and set(layers) <= set(units["checkpointed"])
    got, want = read_metrics(tmp_path / "flow_vla_fsdp"), read_metrics(tmp_path / "flow_vla_single")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for row, ref in zip(got, want):
        assert row["loss"] == pytest.approx(ref["loss"], rel=1e-5), f"loss at step {row['step']}"
        assert row["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4), f"grad norm at step {row['step']}"
    valid, valid_ref = read_metrics(tmp_path / "flow_vla_fsdp", "valid")[-1], read_metrics(tmp_path / "flow_vla_single",
                                                                                            "valid")[-1]
    assert valid["action_mae"] == pytest.approx(valid_ref["action_mae"], rel=1e-4)  # predict under FSDP2
