"""SmolVLA as LeRobot builds it (SmolVLM backbone, action expert, flow matching); importing it registers "smolvla"."""

from longboat.models.policy.smolvla.config import SmolVLAConfig, SmolVLAExpertConfig
from longboat.models.policy.smolvla.model import SmolVLA
from longboat.models.registry import ModelSpec, register_model

SMOLVLA = register_model(ModelSpec(
    name="smolvla",
    config=SmolVLAConfig,
    module=SmolVLA,
    # Not the backbone's layers: they hand their keys and values to the expert beside their output (as flow_vla's).
    parallel_units=("vlm.vision.blocks", "expert.layers"),
    forward_methods=("predict",),
))

__all__ = ["SMOLVLA", "SmolVLA", "SmolVLAConfig", "SmolVLAExpertConfig"]
