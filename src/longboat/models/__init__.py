"""Model families and their registry; the imports below fill the registry."""

from torch import nn

from longboat.config.base import validate
from longboat.models import diffusion  # noqa: F401  (registers "dit")
from longboat.models import llm  # noqa: F401  (registers "decoder")
from longboat.models import policy  # noqa: F401  (registers the robot policies)
from longboat.models import vlm  # noqa: F401  (registers "vlm")
from longboat.models.registry import ModelSpec, get_model, hf_spec, model_names, register_model, spec_of

__all__ = ["ModelSpec", "build_model", "get_model", "hf_spec", "model_names", "register_model", "spec_of"]


def build_model(arch: str, cfg_dict: dict) -> nn.Module:
    """Validate ``cfg_dict`` against the architecture's config class and build the module."""
    spec = get_model(arch)
    return spec.build(validate(spec.config, cfg_dict, source=f"model '{arch}'"))
