"""One rank of the streamed HF import under FSDP2: the model built on the meta device and sharded, the weights
read by rank 0 alone, shard file by shard file, then a forward and the gathered state written for comparison.

    torchrun --nproc_per_node=2 tests/distributed/hf_load_worker.py HF_DIR CORRUPT_HF_DIR OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

import longboat.models.llm.hf.stream as stream
from longboat.distributed import ParallelConfig, build_mesh
from longboat.distributed.parallelize import parallelize
from longboat.distributed.rank0_weights import load_from_rank0
from longboat.models import get_model
from longboat.models.llm.hf import hf_model_config

TOKENS = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))


def sharded_model(cfg):
    with torch.device("meta"):
        model = get_model("decoder").build(cfg)
    parallel = ParallelConfig(meta_init=True)
    return parallelize(model, build_mesh(parallel, "cpu"), parallel, None, "cpu")


def main(hf_dir: str, corrupt_dir: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    opened = []
    real_open = stream.safe_open
    stream.safe_open = lambda path, **kw: (opened.append(Path(path).name), real_open(path, **kw))[1]
    try:
        _, cfg = hf_model_config(hf_dir)
        model = sharded_model(cfg)
        groups = get_model("decoder").hf.stream_weights(hf_dir, cfg) if rank == 0 else None
        load_from_rank0(model, groups, distributed=True)
        sharded = all(isinstance(p, DTensor) for p in model.parameters())
        with torch.no_grad():
            logits = model(TOKENS)
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

        failure = ""
        groups = get_model("decoder").hf.stream_weights(corrupt_dir, cfg) if rank == 0 else None
        try:
            load_from_rank0(sharded_model(cfg), groups, distributed=True)
        except Exception as e:  # noqa: BLE001 - the test checks every rank got an error naming the file
            failure = f"{type(e).__name__}: {e}"
        torch.save({"opened": opened, "sharded": sharded, "logits": logits, "state": state, "failure": failure},
                   Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
