"""ACT (Action Chunking with Transformers); importing this package registers the "act" architecture."""

from longboat.models.policy.act.config import ACTConfig
from longboat.models.policy.act.model import ACT
from longboat.models.registry import ModelSpec, register_model

ACT_SPEC = register_model(ModelSpec(
    name="act",
    config=ACTConfig,
    module=ACT,
    presets="longboat.models.policy.act",
    parallel_units=("backbone", "vae_encoder.layers", "encoder.layers", "decoder.layers"),
    forward_methods=("predict",),
))

__all__ = ["ACT", "ACTConfig", "ACT_SPEC"]
