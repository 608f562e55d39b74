"""A model's whole weights from its shards, for exports."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict


class _NoSequentialGatherWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.args and "all_gather" in record.args)


@contextlib.contextmanager
def quiet_sequential_gathers() -> Iterator[None]:
    """An FSDP × TP weight (``_StridedShard`` on dp_shard, ``Shard`` on tp) is gathered in two all-gathers, which
    torch cannot merge and warns about on every rank. An export gathers once per run: the warning says nothing the
    user can act on. Other warnings of that logger still print."""
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    quiet = _NoSequentialGatherWarning()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def full_model_state(model: nn.Module, cpu_offload: bool = False) -> dict[str, torch.Tensor]:
    """``get_model_state_dict`` with full tensors: a collective (every rank calls it); with ``cpu_offload`` only
    rank 0 gets the tensors, on CPU, gathered one at a time."""
    with quiet_sequential_gathers():
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload))
