"""The converters between LeRobot's policy directories and longboat's policies, one per LeRobot ``type``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from longboat.errors import LongboatError
from longboat.utils.registry import Registry


class LeRobotError(LongboatError, ValueError):
    """A LeRobot directory longboat cannot read or a policy it cannot write in LeRobot's layout; names the file."""


@dataclass(frozen=True)
class Converter:
    """One LeRobot policy type: its architecture here and the maps between the two configs and state dicts.

    ``config_in(lerobot_config, source)`` -> our model config (a dict; refuses what it cannot represent, naming the
    key); ``config_out(our_config, base)`` -> LeRobot's config.json keys, updating ``base`` (the original
    config.json when the policy came from LeRobot); ``weights_in`` / ``weights_out`` rename (and split or join)
    tensors without changing a byte of them."""

    lerobot_type: str
    arch: str
    config_in: Callable[[dict, str], dict]
    config_out: Callable[[dict, dict], dict]
    weights_in: Callable[[dict[str, torch.Tensor], dict], dict[str, torch.Tensor]]
    weights_out: Callable[[dict[str, torch.Tensor], dict], dict[str, torch.Tensor]]
    #: the image transforms the policy applies inside its model (after normalisation), as longboat transforms
    transforms_in: Callable[[dict], list[dict]] = lambda config: []
    #: config.json keys for the transforms an export lists after its normalisation (refusing what has no key)
    transforms_out: Callable[[list[dict], str], dict] | None = None


CONVERTERS: Registry = Registry("LeRobot policy type")


def register_converter(converter: Converter) -> Converter:
    CONVERTERS.register(converter.lerobot_type, converter)
    return converter


def converter_for_type(lerobot_type: object, source: str) -> Converter:
    if not isinstance(lerobot_type, str) or lerobot_type not in CONVERTERS:
        raise LeRobotError(f"{source}: type {lerobot_type!r} is not a LeRobot policy type longboat converts "
                           f"(known: {', '.join(sorted(CONVERTERS))})")
    return CONVERTERS.get(lerobot_type)


def converter_for_arch(arch: str, source: str) -> Converter:
    for name in sorted(CONVERTERS):
        if CONVERTERS.get(name).arch == arch:
            return CONVERTERS.get(name)
    known = ", ".join(sorted(CONVERTERS.get(n).arch for n in CONVERTERS))
    raise LeRobotError(f"{source}: a '{arch}' policy has no LeRobot layout (longboat writes: {known})")
