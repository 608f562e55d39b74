"""How a run is spread over devices: the mesh axes and what each parallelism applies."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from longboat.config.base import StrictModel


class ParallelConfig(StrictModel):
    """Mesh degrees and per-block options; the default is one process on one device.

    The world is ``dp_replicate × dp_shard × tp`` ranks. With ``data_parallel: fsdp``, parameters are sharded over
    ``dp_shard`` and replicated over ``dp_replicate`` (both > 1: HSDP). With ``ddp`` every data-parallel rank
    (``dp_replicate × dp_shard``) holds a full replica. ``ep`` is carved out of ``dp_shard``: groups of ``ep``
    neighbouring ``dp_shard`` ranks split the routed experts among them, and FSDP shards each expert over the
    ``dp_shard / ep`` ranks left; everything else stays sharded over all of ``dp_shard``.
    """

    dp_replicate: int = Field(default=1, ge=1)
    dp_shard: int = Field(default=-1, ge=-1, description="-1: every rank the other axes leave")
    tp: int = Field(default=1, ge=1, description="tensor (and sequence) parallel degree")
    ep: int = Field(default=1, ge=1, description="expert parallel degree, a divisor of dp_shard and of n_experts")
    data_parallel: Literal["fsdp", "ddp"] = "fsdp"
    reshard_after_forward: bool = Field(default=True, description="FSDP: free gathered blocks after forward")
    param_dtype: Literal["fp32", "bf16"] = Field(default="fp32", description="FSDP compute dtype of parameters")
    reduce_dtype: Literal["fp32", "bf16"] = Field(default="fp32", description="dtype gradients are reduced in")
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    ac_every: int = Field(default=1, ge=1, description="checkpoint every k-th block")
    compile: bool = Field(default=False, description="torch.compile each block")
    meta_init: bool = Field(default=False, description="build on the meta device, allocate only local shards")
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    timeout_minutes: float = Field(default=10.0, gt=0, description="a collective that waits longer fails the run")

    @model_validator(mode="after")
    def _check(self) -> ParallelConfig:
        if self.dp_shard == 0:
            raise ValueError("parallel.dp_shard must be -1 (the rest of the world) or a positive degree, got 0")
        if self.data_parallel == "ddp":
            if self.tp > 1:
                raise ValueError(
                    f"parallel.data_parallel=ddp cannot be combined with tensor parallel (parallel.tp={self.tp}); "
                    "use parallel.data_parallel=fsdp"
                )
            if self.param_dtype != "fp32":
                raise ValueError(
                    "parallel.param_dtype=bf16 needs parallel.data_parallel=fsdp; with ddp use train.dtype=bf16 "
                    "(autocast) instead"
                )
        if self.ep > 1:
            if self.data_parallel != "fsdp":
                raise ValueError(f"parallel.ep={self.ep} needs parallel.data_parallel=fsdp, which shards the experts")
            if self.tp > 1:
                raise ValueError(
                    f"parallel.ep={self.ep} cannot be combined with tensor parallel (parallel.tp={self.tp})"
                )
            if self.compile:
                raise ValueError(
                    f"parallel.ep={self.ep} cannot be combined with parallel.compile: the all-to-all sizes depend on "
                    "the routing, which a compiled block cannot read"
                )
        return self
