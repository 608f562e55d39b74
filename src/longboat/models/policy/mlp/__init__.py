"""The behaviour-cloning MLP policy; importing this package registers the "mlp" architecture."""

from longboat.models.policy.mlp.config import MLPPolicyConfig
from longboat.models.policy.mlp.model import MLPPolicy
from longboat.models.registry import ModelSpec, register_model

MLP = register_model(ModelSpec(
    name="mlp",
    config=MLPPolicyConfig,
    module=MLPPolicy,
    presets="longboat.models.policy.mlp",
    parallel_units=("blocks",),
    forward_methods=("predict",),
))

__all__ = ["MLP", "MLPPolicy", "MLPPolicyConfig"]
