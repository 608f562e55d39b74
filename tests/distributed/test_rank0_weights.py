"""Training from an HF checkpoint on 2 gloo ranks under FSDP2: rank 0 streams the shard files, each rank keeps its
shards, and the result equals the single-process import."""

from __future__ import annotations

import shutil

import pytest
import torch

from longboat.models.llm.hf import load_hf_model
from tests.distributed.conftest import finish, free_ports, start, torchrun
from tests.distributed.hf_load_worker import TOKENS
from tests.models.llm.hf.test_stream import moe_dir  # noqa: F401 - the module fixture

WORKER = "tests/distributed/hf_load_worker.py"


@pytest.mark.slow
def test_fsdp_ranks_get_the_streamed_import_of_rank_0(moe_dir, tmp_path):  # noqa: F811
    src, expected = moe_dir
    corrupt = tmp_path / "corrupt"
    shutil.copytree(src, corrupt)
    bad = sorted(corrupt.glob("*.safetensors"))[-1]
    bad.write_bytes(bad.read_bytes()[:100])
    log = tmp_path / "log.txt"
    out = finish(start(torchrun(2, free_ports(1)[0], WORKER, str(src), str(corrupt), str(tmp_path)), log), log, 240)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    ours, _, _ = load_hf_model(src, dtype="float32")
    single = ours.state_dict()
    with torch.no_grad():
        torch.testing.assert_close(ours(TOKENS), expected, atol=1e-4, rtol=1e-4)
    gathered = ranks[0]["state"]  # gathered to rank 0 only (cpu_offload)
    assert gathered.keys() == single.keys()
    for name, value in single.items():
        torch.testing.assert_close(gathered[name], value, atol=0, rtol=0, msg=name)
    for r in ranks:
        assert r["sharded"], out
        torch.testing.assert_close(r["logits"], expected, atol=1e-4, rtol=1e-4)
        assert "not a readable safetensors file" in r["failure"] and bad.name in r["failure"]
    # Rank 0 opens each file twice (headers, then tensors), then the corrupt copy's headers up to the bad file,
    # before reading any of its tensors; rank 1 opens none.
    names = sorted(p.name for p in src.glob("*.safetensors"))
    assert ranks[0]["opened"] == names + names + names and names[-1] == bad.name
    assert ranks[1]["opened"] == []
    assert ranks[1]["failure"].startswith("Rank0ReadError: rank 0 could not read the weights")
