"""How a run is spread over devices: the mesh axes and what each parallelism applies."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from longboat.config.base import StrictModel


class ParallelConfig(StrictModel):
    """Mesh degrees and per-block options; the default is one process on one device.

    The world is ``pp × dp_replicate × dp_shard × cp × tp`` ranks. With ``data_parallel: fsdp``, parameters are
    sharded over ``dp_shard`` and replicated over ``dp_replicate`` (both > 1: HSDP). With ``ddp`` every
    data-parallel rank (``dp_replicate × dp_shard``) holds a full replica. With ``pp > 1`` each group of ``dp_replicate × dp_shard ×
    tp`` ranks holds one pipeline stage (``pp_virtual_stages`` of them for the interleaved schedule).
    ``ep`` is carved out of ``dp_shard``: groups of ``ep`` neighbouring ``dp_shard`` ranks split the routed experts
    among them, and FSDP shards each expert over the ``dp_shard / ep`` ranks left; everything else stays sharded
    over all of ``dp_shard``. With ``tp > 1`` every expert's ffn units are split over ``tp`` as well, and each tp
    rank exchanges tokens with the ranks of its own tp index. ``cp`` ranks hold the same samples and each a share of
    their token sequence (Ulysses context parallelism, where the model's spec plans it); FSDP shards parameters over
    ``dp_shard × cp``, and gradients are reduced over both.
    """

    dp_replicate: int = Field(default=1, ge=1)
    dp_shard: int = Field(default=-1, ge=-1, description="-1: every rank the other axes leave")
    tp: int = Field(default=1, ge=1, description="tensor (and sequence) parallel degree")
    ep: int = Field(default=1, ge=1, description="expert parallel degree, a divisor of dp_shard and of n_experts")
    pp: int = Field(default=1, ge=1, description="pipeline-parallel degree: stages of consecutive layers")
    cp: int = Field(default=1, ge=1, description="context-parallel degree: ranks splitting each sample's tokens")
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = "1f1b"
    pp_virtual_stages: int = Field(default=1, ge=1, description="stages per pipeline rank (interleaved_1f1b: >= 2)")
    pp_layers: list[int] | None = Field(
        default=None, description="layers of each stage, in order (default: an even split, earlier stages one more)"
    )
    data_parallel: Literal["fsdp", "ddp"] = "fsdp"
    reshard_after_forward: bool = Field(default=True, description="FSDP: free gathered blocks after forward")
    param_dtype: Literal["fp32", "bf16"] = Field(default="fp32", description="FSDP compute dtype of parameters")
    reduce_dtype: Literal["fp32", "bf16"] = Field(default="fp32", description="dtype gradients are reduced in")
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    ac_every: int = Field(default=1, ge=1, description="checkpoint every k-th block")
    compile: bool = Field(default=False,
                          description="torch.compile each block (under expert parallel: its parts around the experts)")
    meta_init: bool = Field(default=False, description="build on the meta device, allocate only local shards")
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    timeout_minutes: float = Field(default=10.0, gt=0, description="a collective that waits longer fails the run")

    @model_validator(mode="after")
    def _check(self) -> ParallelConfig:
        if self.dp_shard == 0:
            raise ValueError("parallel.dp_shard must be -1 (the rest of the world) or a positive degree, got 0")
        self._check_pipeline()
        if self.cp > 1:
            others = [f"{axis}={getattr(self, axis)}" for axis in ("tp", "pp", "ep") if getattr(self, axis) > 1]
            if others:
                raise ValueError(f"parallel.cp={self.cp} cannot be combined with {', '.join(others)}: context "
                                 "parallelism runs beside data parallelism only")
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
        return self

    def _check_pipeline(self) -> None:
        if self.pp_schedule == "interleaved_1f1b" and self.pp_virtual_stages < 2:
            raise ValueError("parallel.pp_schedule=interleaved_1f1b needs parallel.pp_virtual_stages >= 2 (stages "
                             f"per rank), got {self.pp_virtual_stages}")
        if self.pp_schedule != "interleaved_1f1b" and self.pp_virtual_stages > 1:
            raise ValueError(f"parallel.pp_virtual_stages={self.pp_virtual_stages} needs "
                             f"parallel.pp_schedule=interleaved_1f1b; {self.pp_schedule} runs one stage per rank")
        if self.pp_layers is not None:
            stages = self.pp * self.pp_virtual_stages
            if len(self.pp_layers) != stages or min(self.pp_layers) < 1:
                raise ValueError(f"parallel.pp_layers must give {stages} positive layer counts (pp × "
                                 f"pp_virtual_stages), got {self.pp_layers}")
        if self.pp > 1 and self.data_parallel == "ddp":
            raise ValueError("parallel.pp > 1 shards each stage with FSDP; use parallel.data_parallel=fsdp")
