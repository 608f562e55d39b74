"""torch.distributed for longboat: the runtime (process group), the device mesh and ``parallelize``."""

from longboat.distributed.config import ParallelConfig
from longboat.distributed.mesh import ParallelDims, ParallelMesh, build_mesh, resolve_dims
from longboat.distributed.parallelize import parallelize
from longboat.distributed.runtime import Runtime, init_runtime, launched_world_size, shutdown

__all__ = [
    "ParallelConfig",
    "ParallelDims",
    "ParallelMesh",
    "Runtime",
    "build_mesh",
    "init_runtime",
    "launched_world_size",
    "parallelize",
    "resolve_dims",
    "shutdown",
]
