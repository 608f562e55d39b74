"""Diffusion networks over images and latents; importing this package registers the "dit" architecture."""

from longboat.models.diffusion.dit import DiT, DiTConfig
from longboat.models.registry import ModelSpec, register_model


def _tensor_parallel_plan(cfg: DiTConfig, tp: int) -> dict:
    # DTensor's parallel styles load on first use: a run without tp > 1 never pays for them.
    from longboat.models.diffusion.parallel_plan import tensor_parallel_plan

    return tensor_parallel_plan(cfg, tp)


DIT_SPEC = register_model(ModelSpec(
    name="dit",
    config=DiTConfig,
    module=DiT,
    presets="longboat.models.diffusion",
    parallel_units=("blocks",),
    tensor_parallel=_tensor_parallel_plan,
))

__all__ = ["DIT_SPEC", "DiT", "DiTConfig"]
