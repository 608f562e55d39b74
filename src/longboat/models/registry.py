"""Model registry: architecture name -> (config class, module class), filled by ``@register_model``."""

from __future__ import annotations

from typing import Callable

from torch import nn

from longboat.config.base import ConfigError, StrictModel

_MODELS: dict[str, tuple[type[StrictModel], type[nn.Module]]] = {}


def register_model(name: str, config_cls: type[StrictModel]) -> Callable[[type[nn.Module]], type[nn.Module]]:
    def wrap(cls: type[nn.Module]) -> type[nn.Module]:
        if name in _MODELS:
            raise ValueError(f"model '{name}' registered twice")
        _MODELS[name] = (config_cls, cls)
        return cls

    return wrap


def get_model(name: str) -> tuple[type[StrictModel], type[nn.Module]]:
    if name not in _MODELS:
        raise ConfigError(f"unknown model architecture '{name}'; known: {', '.join(sorted(_MODELS))}")
    return _MODELS[name]


def model_names() -> list[str]:
    return sorted(_MODELS)
