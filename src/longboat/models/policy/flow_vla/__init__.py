"""The flow-matching vision-language-action policy (pi0-style); importing it registers the "flow_vla" architecture."""

from longboat.models.policy.flow_vla.config import ExpertConfig, FlowVLAConfig
from longboat.models.policy.flow_vla.model import FlowVLA
from longboat.models.policy.flow_vla.weights import BackboneWeights
from longboat.models.registry import ModelSpec, register_model

FLOW_VLA = register_model(ModelSpec(
    name="flow_vla",
    config=FlowVLAConfig,
    module=FlowVLA,
    presets="longboat.models.policy.flow_vla",
    # The backbone's layers return their keys and values as outputs (PrefixBlock), so each is a unit of its own.
    parallel_units=("vision.blocks", "backbone.layers", "expert.layers"),
    forward_methods=("predict",),
    initial_weights=BackboneWeights(),
))

__all__ = ["FLOW_VLA", "ExpertConfig", "FlowVLA", "FlowVLAConfig"]
