"""The transform contract, the registry of transforms by name, and the checks transforms share.

A transform maps an item (a dict of tensors keyed like LeRobot: ``observation.state``, ``action``,
``observation.images.<cam>``, ``<key>_is_pad``) to a new item, leaving the input untouched. Tensors may carry any
leading (batch, time) dimensions. An invertible transform also maps model outputs back (``unapply``). Statistics a
transform reads are declared by ``needs`` so the pipeline checks them before work and serialises exactly them.

``apply_batch`` transforms a collated batch (the training device's path) as ``apply`` transforms each of its
samples, sample i drawing from ``generators[i]`` in the order ``apply`` draws; by default sample by sample, which is
right for any transform. A transform whose ``apply`` treats leading dimensions alike and draws nothing sets
``batchable`` and takes the batch whole; a random one overrides ``apply_batch`` with its batch form.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence

import torch

from longboat.config.base import ConfigError, StrictModel
from longboat.errors import LongboatError
from longboat.utils.registry import Registry, RegistryError, source_of

Stats = dict[str, dict[str, torch.Tensor]]  # stats[feature][stat], float32 tensors shaped like the feature


class TransformError(LongboatError, ValueError):
    """An item does not fit a transform (a key missing, a wrong shape or dtype); the message names the key."""


class Transform:
    """One step of a pipeline, built from its validated ``Config`` and the statistics it ``needs``.

    ``training`` is set by the pipeline: random transforms draw only while it is true and are deterministic
    (identity or a centre crop) otherwise.
    """

    name: ClassVar[str]
    Config: ClassVar[type[StrictModel]]
    invertible: ClassVar[bool] = False
    #: ``apply`` draws nothing and treats every leading (batch, time) dimension alike: a batch is one item
    batchable: ClassVar[bool] = False

    def __init__(self, cfg: Any, stats: Stats):
        self.cfg = cfg
        self.stats: Stats = {}  # what it read: the pipeline serialises these
        for feature, stat in self.needs(cfg):
            self.stats.setdefault(feature, {})[stat] = stats[feature][stat]
        self.training = True

    @classmethod
    def needs(cls, cfg: Any) -> list[tuple[str, str]]:
        """The (feature, stat) pairs this transform reads from the dataset statistics."""
        return []

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        raise NotImplementedError

    def apply_batch(self, batch: dict, generators: Sequence[torch.Generator]) -> dict:
        """A collated batch of ``len(generators)`` samples, each transformed as ``apply`` transforms it."""
        if self.batchable:
            return self.apply(batch)
        n = len(generators)
        return stack_items([self.apply(item, g) for item, g in zip(split_batch(batch, n), generators)])

    def unapply(self, item: dict) -> dict:
        raise TransformError(f"{self.name}: not invertible")


_TRANSFORMS: Registry[type[Transform]] = Registry("transform", "known transforms", ConfigError)


def register_transform(name: str) -> Callable[[type[Transform]], type[Transform]]:
    def wrap(cls: type[Transform]) -> type[Transform]:
        if not (isinstance(getattr(cls, "Config", None), type) and issubclass(cls.Config, StrictModel)):
            raise RegistryError(f"transform '{name}' ({source_of(cls)}) must define Config, a StrictModel")
        _TRANSFORMS.register(name, cls)
        cls.name = name
        return cls

    return wrap


def get_transform(name: str) -> type[Transform]:
    return _TRANSFORMS.get(name)


def transform_names() -> list[str]:
    return _TRANSFORMS.names()


def image_of(item: dict, key: str, transform: str) -> torch.Tensor:
    """``item[key]`` checked to be a float image tensor [..., C, H, W]."""
    if key not in item:
        raise TransformError(f"{transform}: the item has no '{key}'; it has: {', '.join(sorted(item))}")
    x = item[key]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim < 3:
        got = f"{x.dtype} tensor of shape {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TransformError(f"{transform}: '{key}' must be a float image tensor [..., C, H, W], got {got}")
    return x


def vector_of(item: dict, key: str, transform: str, min_dims: int = 1) -> torch.Tensor:
    """``item[key]`` checked to be a tensor [..., D] with at least ``min_dims`` dimensions."""
    x = item[key]
    if not isinstance(x, torch.Tensor) or x.ndim < min_dims:
        got = f"shape {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TransformError(f"{transform}: '{key}' must be a tensor with at least {min_dims} dimension(s), got {got}")
    return x


def as_images(x: torch.Tensor) -> tuple[torch.Tensor, torch.Size]:
    """[..., C, H, W] -> ([N, C, H, W], leading shape), so every image is treated alike."""
    lead = x.shape[:-3]
    return x.reshape(-1, *x.shape[-3:]), lead


def split_batch(batch: dict, n: int) -> list[dict]:
    """A collated batch of ``n`` samples back into its samples: tensors and lists indexed on their first dimension,
    anything else shared."""
    def part(value: Any, i: int) -> Any:
        if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == n:
            return value[i]
        return value[i] if isinstance(value, (list, tuple)) and len(value) == n else value

    return [{key: part(value, i) for key, value in batch.items()} for i in range(n)]


def stack_items(items: list[dict]) -> dict:
    """Samples collated again: tensors stacked, other values listed."""
    return {key: torch.stack([it[key] for it in items]) if isinstance(items[0][key], torch.Tensor)
            else [it[key] for it in items] for key in items[0]}
