"""Model registry: an architecture's name -> its ``ModelSpec``, everything the engine asks about it.

Nothing above ``models/`` names an architecture: the train recipe, ``parallelize`` and the artifact loader
read the spec. A model family registers its spec in its package ``__init__``; user code does the same from a
run config's ``plugins:``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import yaml
from torch import nn

from longboat.config.base import ConfigError, StrictModel
from longboat.models.contracts import NO_HOOKS, ModelHooks
from longboat.utils.registry import Registry


class HFInterop(Protocol):
    """Hugging Face checkpoints in and out for one architecture (the decoder's lives in ``models/llm``)."""

    def families(self) -> list[str]: ...  # HF ``model_type`` values it reads
    def load(self, hf_dir: str | Path, dtype: str | None = None) -> tuple: ...  # (model, cfg, family, files)
    def config_fields(self, hf_dir: str | Path) -> dict: ...  # config.json -> fields of the spec's config
    def read_weights(self, hf_dir: str | Path, cfg: Any) -> dict: ...  # our state dict, our names
    def stream_weights(self, hf_dir: str | Path, cfg: Any) -> Iterator[dict]: ...  # the same, a group at a time
    def export_family(self, cfg: Any, requested: bool | str, source: str | Path | None) -> str: ...
    def tensor_name(self, family: str, name: str) -> str | None: ...  # ours -> the family's, None: no counterpart
    def save(self, weights: Any, family: str, out: str | Path, cfg: Any, tokenizer_dir: str | Path | None = None,
             dtype: str | None = None, max_shard_size: int | str = "5GB") -> Path: ...


class InitialWeights(Protocol):
    """Pretrained weights some of an architecture's parameters start from (e.g. a VLA's language backbone)."""

    def source(self, cfg: Any) -> str | None: ...  # where they come from; None: random initialisation only
    def read(self, cfg: Any) -> dict: ...  # a partial state dict under the model's names (read on rank 0)


@dataclass(frozen=True)
class PipelineSplit:
    """How pipeline parallelism cuts a model, by the names of its children: the ``layers`` list into stages of
    consecutive layers, ``first`` kept on the first stage only, ``last`` on the last stage only. Without its
    ``first`` children the model's forward takes the previous stage's output, without ``last`` it returns its
    layers' output. ``tied`` names ``first`` children the last stage keeps as well, because its head reads their
    weights (tied embeddings): the two stages hold equal copies, and their gradients are summed after each step."""

    layers: str
    first: tuple[str, ...]
    last: tuple[str, ...]
    tied: tuple[str, ...] = ()
    # The dim over which the tensor-parallel plan shards the activations between layers (sequence parallel), which
    # the stages gather for the next one; None: they pass whole.
    tp_sequence_dim: int | None = None


@dataclass(frozen=True)
class SequenceCut:
    """A place where context parallelism cuts the token sequence or joins it again: the input ``arg`` of every
    module ``module`` names (``*`` is one dotted component, as in a tensor-parallel plan), or its output when
    ``arg`` is None, along ``dim``. A tuple of tensors there (rotary cos and sin) is cut tensor by tensor."""

    module: str
    dim: int
    arg: str | None = None


@dataclass(frozen=True)
class SequencePlan:
    """How context parallelism (Ulysses) spreads a model's token sequence over the ``cp`` ranks, as plain data.

    ``split``: where each rank keeps its own contiguous ``1/cp`` of the tokens (and of whatever is per token, such
    as rotary angles computed for the whole grid). ``attention``: the attention cores, modules whose forward takes
    queries, keys and values [B, N, H, D] and returns [B, N, H, D]; around each, an all-to-all trades the rank's
    tokens of all heads for all tokens of ``H / cp`` heads, and back after. Everything else in the model works per
    token (or on inputs every rank holds whole, such as text for cross-attention) and needs no communication.
    ``gather``: where the whole sequence is assembled again on every rank. ``heads``: the config field ``cp`` must
    divide."""

    split: tuple[SequenceCut, ...]
    attention: tuple[str, ...]
    gather: tuple[SequenceCut, ...]
    heads: str = "num_heads"


@dataclass(frozen=True)
class ModelSpec:
    """What the engine needs to know about an architecture.

    ``parallel_units`` name the modules that activation checkpointing, compile and FSDP treat as units: a
    ``ModuleList``/``ModuleDict`` contributes each child, any other module itself (LeRobot's ``_fsdp_wrap_modules``).
    ``tensor_parallel(cfg, tp)`` checks that the config can be split ``tp`` ways and returns the plan (module
    pattern -> parallel style); None: the architecture has no tensor-parallel plan.
    ``forward_methods`` name methods besides ``forward`` that run the whole model (a policy's ``predict``), so
    FSDP2 gathers the weights for them too. ``initial_weights``: loaded into a new run's model before training
    (a resumed run's checkpoint replaces them). ``pipeline(cfg)`` checks that the config can be pipelined and
    says how to cut the model (None: no pipeline parallelism). ``sequence_parallel``: where context parallelism cuts the
    token sequence (None: no context parallelism). ``hooks``: what the trainer, the tasks and
    ``longboat.distributed`` ask of the model beyond ``forward`` (``models/contracts.py``).
    """

    name: str
    config: type[StrictModel]
    module: type[nn.Module]
    presets: str | None = None  # package whose ``preset_folder`` holds ``<name>.yaml`` config fields
    preset_folder: str = "presets"  # relative to the ``presets`` package, "/"-separated ("presets/wan_vae")
    parallel_units: tuple[str, ...] = ()
    forward_methods: tuple[str, ...] = ()
    tensor_parallel: Callable[[Any, int], dict] | None = None
    hf: HFInterop | None = None
    initial_weights: InitialWeights | None = None
    pipeline: Callable[[Any], PipelineSplit] | None = None
    sequence_parallel: SequencePlan | None = None
    hooks: ModelHooks = NO_HOOKS

    def build(self, cfg: StrictModel) -> nn.Module:
        return self.module(cfg)

    def preset_names(self) -> list[str]:
        if self.presets is None:
            return []
        root = self._preset_root()
        return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml") and p.is_file())

    def load_preset(self, name: str) -> dict:
        known = self.preset_names()
        if name not in known:
            raise ConfigError(f"unknown model preset '{name}' for '{self.name}'; known: {', '.join(known) or 'none'}")
        return yaml.safe_load((self._preset_root() / f"{name}.yaml").read_text())

    def _preset_root(self):
        root = resources.files(self.presets)
        for part in self.preset_folder.split("/"):
            root = root / part
        return root

    def tensor_parallel_plan(self, cfg: StrictModel, tp: int) -> dict | None:
        """The checked plan for ``tp`` ranks, or None when ``tp == 1``."""
        if tp == 1:
            return None
        if self.tensor_parallel is None:
            raise ConfigError(f"model '{self.name}' has no tensor-parallel plan; set parallel.tp=1")
        return self.tensor_parallel(cfg, tp)

    def sequence_plan(self, cfg: StrictModel, cp: int) -> SequencePlan | None:
        """The plan for ``cp`` context-parallel ranks after checking that they split whole heads; None when
        ``cp == 1``."""
        if cp == 1:
            return None
        plan = self.sequence_parallel
        if plan is None:
            raise ConfigError(f"model '{self.name}' has no sequence-parallel plan; set parallel.cp=1")
        heads = getattr(cfg, plan.heads)
        if heads % cp:
            raise ConfigError(f"parallel.cp={cp} must divide model.{plan.heads} ({heads}): each context-parallel "
                              "rank attends with whole heads")
        return plan

    def pipeline_split(self, cfg: StrictModel) -> PipelineSplit:
        if self.pipeline is None:
            raise ConfigError(f"model '{self.name}' cannot be split into pipeline stages; set parallel.pp=1")
        return self.pipeline(cfg)


_MODELS: Registry[ModelSpec] = Registry("model architecture", "known", ConfigError)


def register_model(spec: ModelSpec) -> ModelSpec:
    # A spec is an instance: it is placed by the code that registers it (the same code run again is no error).
    return _MODELS.register(spec.name, spec, stacklevel=2)


def get_model(name: str) -> ModelSpec:
    return _MODELS.get(name)


def model_names() -> list[str]:
    return _MODELS.names()


def spec_of(model: nn.Module) -> ModelSpec:
    """The spec whose module class ``model`` is (or derives from, as FSDP2's wrapper classes do)."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    for spec in _MODELS.values():
        if isinstance(model, spec.module):
            return spec
    raise ConfigError(f"{type(model).__name__} is not a registered model")


def hooks_of(model: nn.Module) -> ModelHooks:
    """The hooks ``model``'s spec declares; none for a module no spec registers (a bare layer, a test's model).
    The nearest registered class in its MRO decides: a registered subclass has its own spec, FSDP2's wrapper class
    its model's."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    for cls in type(model).__mro__:
        for spec in _MODELS.values():
            if spec.module is cls:
                return spec.hooks
    return NO_HOOKS


def hooks_for_config(cfg: Any) -> ModelHooks:
    """The hooks of the first spec whose config class ``cfg`` is (a task sees the config, not the model)."""
    for spec in _MODELS.values():
        if type(cfg) is spec.config:
            return spec.hooks
    return NO_HOOKS


def hf_spec(hf_dir: str | Path) -> ModelSpec:
    """The spec that reads the Hugging Face directory ``hf_dir`` (by its config.json ``model_type``, or a diffusers
    model's ``_class_name``)."""
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{hf_dir}: not a Hugging Face checkpoint (no config.json)")
    try:
        config = json.loads(path.read_text())
        # transformers names the family in model_type, diffusers names the model class in _class_name.
        model_type = config.get("model_type") or config.get("_class_name")
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"{path}: cannot read a Hugging Face config: {e}") from None
    readers = {f: spec for spec in _MODELS.values() if spec.hf is not None for f in spec.hf.families()}
    if model_type not in readers:
        raise ConfigError(f"{path}: model_type {model_type!r} is not supported; known: {', '.join(sorted(readers))}")
    return readers[model_type]
