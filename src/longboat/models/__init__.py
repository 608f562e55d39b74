"""Model families and their registry; the imports below fill the registry."""

from torch import nn

from longboat.config.base import validate
from longboat.models import llm  # noqa: F401  (registers "decoder")
from longboat.models.registry import get_model, model_names, register_model

__all__ = ["build_model", "get_model", "model_names", "register_model"]


def build_model(arch: str, cfg_dict: dict) -> nn.Module:
    """Validate ``cfg_dict`` against the architecture's config class and build the module."""
    config_cls, model_cls = get_model(arch)
    return model_cls(validate(config_cls, cfg_dict, source=f"model '{arch}'"))
