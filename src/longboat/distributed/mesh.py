"""The device mesh: named axes ``pp × dp_replicate × dp_shard × cp × tp``, validated before any collective runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from longboat.config.base import ConfigError
from longboat.distributed.config import ParallelConfig

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Resolved degree of each mesh axis; their product is the world size."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1  # outermost: each stage's ranks are neighbours, as the inner axes' collectives want
    ep: int = 1  # carved out of dp_shard, not a factor of the world size
    cp: int = 1  # between dp_shard and tp: ranks holding the same samples, each a share of their tokens

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp


def resolve_dims(cfg: ParallelConfig, world_size: int) -> ParallelDims:
    """Fill in ``dp_shard=-1`` and check that the axes multiply to ``world_size``.

    Pure arithmetic on the config and the launch environment, so every rank raises the same error instead of
    some of them waiting in a collective.
    """
    fixed = cfg.pp * cfg.dp_replicate * cfg.cp * cfg.tp
    pp = f"pp={cfg.pp} × " if cfg.pp > 1 else ""
    cp = f"cp={cfg.cp} × " if cfg.cp > 1 else ""
    shard = cfg.dp_shard
    if shard == -1:
        if world_size % fixed:
            raise ConfigError(
                f"parallel: {world_size} ranks cannot be split as {pp}dp_replicate={cfg.dp_replicate} × {cp}"
                f"tp={cfg.tp} × dp_shard (the rest): {world_size} is not a multiple of {fixed}"
            )
        shard = world_size // fixed
    if shard % cfg.ep:
        raise ConfigError(
            f"parallel.ep={cfg.ep} must divide parallel.dp_shard={shard}: the expert-parallel ranks are data-parallel "
            "shard ranks"
        )
    dims = ParallelDims(cfg.dp_replicate, shard, cfg.tp, cfg.pp, cfg.ep, cfg.cp)
    if dims.world_size != world_size:
        raise ConfigError(
            f"parallel: {pp}dp_replicate={dims.dp_replicate} × dp_shard={dims.dp_shard} × {cp}tp={dims.tp} = "
            f"{dims.world_size} ranks, but the job has {world_size}; change the degrees or the number of processes "
            "(set parallel.dp_shard=-1 to use the rest)"
        )
    return dims


class ParallelMesh:
    """The job's ``DeviceMesh`` and the sub-meshes each parallelism works on."""

    def __init__(self, dims: ParallelDims, device_type: str):
        self.dims = dims
        self.world: DeviceMesh = init_device_mesh(
            device_type, (dims.pp, dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp), mesh_dim_names=AXES
        )
        # One flat axis over all data-parallel ranks: the group that splits the data and reduces the loss.
        self.dp: DeviceMesh = self.world["dp_replicate", "dp_shard"]._flatten("dp")
        # Context-parallel ranks hold the same samples, so parameters shard over them as over dp_shard, and their
        # gradients (each rank's share of the tokens) are reduced over them too.
        self._shard_cp: DeviceMesh | None = None
        self._dp_cp: DeviceMesh | None = None
        if dims.cp > 1:
            self._shard_cp = self.world["dp_shard", "cp"]._flatten("dp_shard_cp")
            self._dp_cp = self.world["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
            if dims.dp_replicate > 1:  # HSDP: replicas of the shards over dp_shard × cp
                self._shard_cp = self._dp_cp._unflatten(
                    "dp_cp", (dims.dp_replicate, dims.dp_shard * dims.cp), ("dp_replicate", "dp_shard_cp"))

        # Expert parallel splits dp_shard into dp_shard_mod_ep × ep: neighbouring shard ranks share out the experts.
        self._experts: DeviceMesh | None = None
        if dims.ep > 1:
            self._experts = self.world._unflatten(
                "dp_shard", (dims.dp_shard // dims.ep, dims.ep), ("dp_shard_mod_ep", "ep")
            )

    @property
    def ep(self) -> DeviceMesh | None:
        """The ranks that split the routed experts among them (None without expert parallel)."""
        return self._experts["ep"] if self._experts is not None else None

    @property
    def expert_split(self) -> DeviceMesh | None:
        """What expert parallel splits the routed experts over: ``ep`` (each rank a share of the experts), or
        ``ep × tp`` under tensor parallel (each expert's ffn units split over tp as well). None without it."""
        if self._experts is None:
            return None
        return self._experts["ep", "tp"] if self.dims.tp > 1 else self._experts["ep"]

    @property
    def expert_fsdp(self) -> DeviceMesh | None:
        """What FSDP shards the experts over under expert parallel: the ``dp_shard / ep`` ranks holding the same
        experts (with ``dp_replicate`` for HSDP)."""
        if self._experts is None:
            return None
        if self.dims.dp_replicate > 1:
            return self._experts["dp_replicate", "dp_shard_mod_ep"]
        return self._experts["dp_shard_mod_ep"]

    @property
    def tp(self) -> DeviceMesh | None:
        return self.world["tp"] if self.dims.tp > 1 else None

    @property
    def cp(self) -> DeviceMesh | None:
        """The ranks that split each sample's tokens among them (None without context parallel)."""
        return self.world["cp"] if self.dims.cp > 1 else None

    @property
    def grad_group(self) -> dist.ProcessGroup:
        """The ranks whose gradients DDP averages: the data-parallel ones, with the context-parallel ones."""
        return self._dp_cp.get_group() if self._dp_cp is not None else self.dp_group

    @property
    def pp(self) -> DeviceMesh | None:
        return self.world["pp"] if self.dims.pp > 1 else None

    @property
    def fsdp(self) -> DeviceMesh:
        """1-D (``dp_shard``, or ``dp_shard × cp`` flattened) for FSDP, 2-D (``dp_replicate`` and that) for HSDP."""
        if self._shard_cp is not None:  # the flattened mesh itself: torch deprecates slicing it from the world
            return self._shard_cp
        if self.dims.dp_replicate > 1:
            return self.world["dp_replicate", "dp_shard"]
        return self.world["dp_shard"]

    @property
    def dp_rank(self) -> int:
        return self.dp.get_local_rank()

    @property
    def dp_group(self) -> dist.ProcessGroup:
        return self.dp.get_group()

    def __repr__(self) -> str:
        axes = " × ".join(f"{name} {getattr(self.dims, name)}" for name in AXES
                          if name not in ("pp", "cp") or getattr(self.dims, name) > 1)
        return axes + (f" (ep {self.dims.ep} within dp_shard)" if self.dims.ep > 1 else "")


def build_mesh(cfg: ParallelConfig, device_type: str) -> ParallelMesh:
    """Validate the degrees against the initialised world, then create the mesh (a collective)."""
    dims = resolve_dims(cfg, dist.get_world_size())
    return ParallelMesh(dims, device_type)
