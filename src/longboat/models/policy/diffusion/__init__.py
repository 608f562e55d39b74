"""Diffusion Policy; importing this package registers the "diffusion" architecture."""

from longboat.models.policy.diffusion.config import DiffusionConfig
from longboat.models.policy.diffusion.model import DiffusionPolicy
from longboat.models.registry import ModelSpec, register_model

DIFFUSION = register_model(ModelSpec(
    name="diffusion",
    config=DiffusionConfig,
    module=DiffusionPolicy,
    presets="longboat.models.policy.diffusion",
    parallel_units=("encoder.cameras", "unet.down", "unet.mid", "unet.up"),
    forward_methods=("predict",),
))

__all__ = ["DIFFUSION", "DiffusionConfig", "DiffusionPolicy"]
