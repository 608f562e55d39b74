"""A pipeline: transforms built from a list of ``{type: name, ...config}``, checked against the dataset
statistics before any item is read, applied in order and un-applied (the invertible ones) in reverse.

Item flow at inference: ``obs = pipeline.apply(raw_observation)``; the model reads ``obs``; then
``pipeline.unapply({**obs, "action": model_output})`` walks back, so every step finds what it needs: relative
actions find the state, which the inverses of the steps listed after them (run first) restored to robot units.

A pipeline is carried by its config (``to_dict``, JSON) and the statistics it read (``state_dict``, tensors
keyed ``<feature>/<stat>``, ready for safetensors); ``from_state_dict`` rebuilds the identical pipeline.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import yaml

from longboat.config.base import ConfigError, validate
from longboat.data.robot.transforms.base import Stats, Transform, get_transform, transform_names


class Pipeline:
    def __init__(self, transforms: list[Transform], *, seed: int = 0, train: bool = True):
        self.transforms = transforms
        self.generator = torch.Generator().manual_seed(seed)
        self.train(train)

    @classmethod
    def from_config(cls, specs: Any, stats: Mapping[str, Mapping[str, Any]] | None = None, *,
                    source: str = "config", prefix: str = "transforms", seed: int = 0, train: bool = True) -> Pipeline:
        """Validate every transform's config and the statistics they need, then build them. Errors name
        ``source`` (a file) and the key (``prefix[i].field``)."""
        if not isinstance(specs, list):
            raise ConfigError(f"{source}: '{prefix}' must be a list of transforms, got {type(specs).__name__}")
        configs = [_validate_spec(spec, source, f"{prefix}[{i}]") for i, spec in enumerate(specs)]
        needed = _check_stats(configs, stats or {}, source, prefix)
        return cls([kind(cfg, needed) for kind, cfg in configs], seed=seed, train=train)

    @classmethod
    def from_file(cls, path: str | Path, stats: Mapping[str, Mapping[str, Any]] | None = None, **kwargs) -> Pipeline:
        """A YAML or JSON file holding the list of transforms."""
        path = Path(path)
        try:
            specs = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{path}: cannot read a transform list ({e})") from None
        return cls.from_config(specs, stats, source=str(path), **kwargs)

    @classmethod
    def from_state_dict(cls, specs: list[dict], state_dict: Mapping[str, torch.Tensor], **kwargs) -> Pipeline:
        stats: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in state_dict.items():
            feature, _, stat = key.rpartition("/")
            stats.setdefault(feature, {})[stat] = tensor
        return cls.from_config(specs, stats, **kwargs)

    def apply(self, item: dict, generator: torch.Generator | None = None) -> dict:
        """The transformed item (a new dict; the input is not modified). Random transforms draw from
        ``generator`` when given, else from the pipeline's own, seeded at construction. A dataset should pass one
        seeded from (seed, sample index): loader workers each hold a copy of the pipeline's generator, which would
        repeat the same draws, and per-sample seeds also make a resumed run draw what the first run did."""
        generator = self.generator if generator is None else generator
        for t in self.transforms:
            item = t.apply(item, generator)
        return item

    __call__ = apply

    def apply_batch(self, batch: dict, generators: Sequence[torch.Generator]) -> dict:
        """A collated batch transformed as ``apply`` transforms each sample, sample i drawing from ``generators[i]``
        (seeded as the dataset seeds that sample's): the same values, computed where the batch is (e.g. on the
        training device). Each transform takes the batch whole (``Transform.apply_batch``) or sample by sample."""
        for t in self.transforms:
            batch = t.apply_batch(batch, generators)
        return batch

    def unapply(self, item: dict) -> dict:
        """Model outputs back to robot units: the invertible transforms' inverses, last first."""
        for t in reversed(self.transforms):
            if t.invertible:
                item = t.unapply(item)
        return item

    def train(self, mode: bool = True) -> Pipeline:
        """Random transforms draw only in training mode; in evaluation they are deterministic."""
        self.training = mode
        for t in self.transforms:
            t.training = mode
        return self

    def eval(self) -> Pipeline:
        return self.train(False)

    def to_dict(self) -> list[dict]:
        return [{"type": t.name, **t.cfg.model_dump(mode="json")} for t in self.transforms]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The statistics the transforms read, exactly those, keyed ``<feature>/<stat>``."""
        return {f"{feature}/{stat}": tensor.clone().contiguous()
                for t in self.transforms for feature, by_stat in t.stats.items() for stat, tensor in by_stat.items()}

    def __repr__(self) -> str:
        return f"Pipeline({', '.join(t.name for t in self.transforms)}; training={self.training})"


def _validate_spec(spec: Any, source: str, where: str) -> tuple[type[Transform], Any]:
    if not isinstance(spec, dict):
        raise ConfigError(f"{source}: '{where}' must be a mapping with a 'type', got {type(spec).__name__}")
    if "type" not in spec:
        raise ConfigError(f"{source}: '{where}' has no 'type'; known transforms: {', '.join(transform_names())}")
    name = spec["type"]
    if not isinstance(name, str) or name not in transform_names():
        close = difflib.get_close_matches(str(name), transform_names(), n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"{source}: '{where}.type': unknown transform {name!r}; {hint}"
                          f"known transforms: {', '.join(transform_names())} (one of your own registers through "
                          f"--plugin or the config's plugins:)")
    kind = get_transform(name)
    return kind, validate(kind.Config, {k: v for k, v in spec.items() if k != "type"}, source, where)


def _check_stats(configs: list[tuple[type[Transform], Any]], stats: Mapping[str, Mapping[str, Any]],
                 source: str, prefix: str) -> Stats:
    """The statistics the transforms need, as float32 tensors; a missing feature or stat names the transform."""
    needed: Stats = {}
    for i, (kind, cfg) in enumerate(configs):
        for feature, stat in kind.needs(cfg):
            where = f"{source}: '{prefix}[{i}]' ({kind.name})"
            if feature not in stats:
                raise ConfigError(f"{where} needs stats of '{feature}', which the dataset stats lack; they have: "
                                  f"{', '.join(sorted(stats)) or 'nothing'}")
            if stat not in stats[feature]:
                raise ConfigError(f"{where} needs '{stat}' of '{feature}'; its stats have: "
                                  f"{', '.join(sorted(stats[feature]))}")
            value = stats[feature][stat]
            try:
                array = np.array(value.detach().cpu() if isinstance(value, torch.Tensor) else value, dtype=np.float32)
            except (TypeError, ValueError):
                raise ConfigError(f"{where}: '{stat}' of '{feature}' is not numeric ({type(value).__name__})") from None
            needed.setdefault(feature, {})[stat] = torch.from_numpy(array)
    return needed
