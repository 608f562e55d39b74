"""Full tensors that rank 0 reads (an HF checkpoint, a pretrained backbone) loaded into a possibly sharded model.

Rank 0 hands over one group of tensors at a time (an HF shard file's worth), so no rank ever holds more than the
group it is loading beside its own shards of the model; under FSDP/TP ``set_model_state_dict`` broadcasts each
tensor of the group and every rank keeps only its part. Only rank 0 reads files.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from longboat.errors import LongboatError


class Rank0ReadError(LongboatError):
    """Rank 0 failed while reading the weights the other ranks were waiting for."""


def load_from_rank0(model: torch.nn.Module, groups: Iterable[dict[str, torch.Tensor]] | None,
                    distributed: bool) -> None:
    """Load every group of full tensors (our names) that rank 0 iterates; other ranks pass ``None``.

    Tensors a group leaves out keep their values. A failure while rank 0 reads is raised on every rank, so
    none waits for a broadcast that never comes.
    """
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed, strict=False)
    if not distributed:
        for group in groups:
            set_model_state_dict(model, group, options=options)
        return
    reading = iter(groups) if dist.get_rank() == 0 else None
    while True:
        group, failure, status = {}, None, None
        if reading is not None:
            try:
                group = next(reading, None)
                status = "done" if group is None else "load"
            except Exception as e:  # noqa: BLE001 - passed on to the other ranks, then raised here as it is
                failure, status = e, f"failed: {e}"
        box = [status]
        dist.broadcast_object_list(box, src=0)
        if failure is not None:
            raise failure
        if box[0] == "done":
            return
        if box[0] != "load":
            raise Rank0ReadError(f"rank 0 could not read the weights: {box[0].removeprefix('failed: ')}")
        set_model_state_dict(model, group, options=options)
