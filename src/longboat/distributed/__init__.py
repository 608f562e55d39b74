"""torch.distributed for longboat: the runtime (process group) and the device mesh; ``parallelize`` lives in
``longboat.distributed.parallelize``.

Names load on first use: a config module imports ``longboat.distributed.config`` without paying for the device
mesh and DTensor (which import most of torch.distributed and the compiler) before it has validated anything.
"""

from longboat.utils.lazy import lazy_exports

_EXPORTS = {
    "ParallelConfig": "config",
    "ParallelDims": "mesh",
    "ParallelMesh": "mesh",
    "build_mesh": "mesh",
    "resolve_dims": "mesh",
    "Runtime": "runtime",
    "init_runtime": "runtime",
    "launched_world_size": "runtime",
    "shutdown": "runtime",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
