"""Hugging Face families: one adapter per HF ``model_type``, found by name in a registry.

An adapter lives in ``longboat/models/llm/adapters/<family>.py`` (listed in that package's ``__init__``)::

    @register_hf_adapter("llama")                # key: config.json "model_type"
    class LlamaAdapter(HFAdapter):
        arch = "decoder"                         # our model registry name (longboat.models.get_model)
        architecture = "LlamaForCausalLM"        # config.json "architectures"
        names = NameMap([("model.layers.{i}.mlp.up_proj.weight", "layers.{i}.feed_forward.w3.weight"), ...])
        def config_from_hf(self, hf: dict) -> dict: ...  # config.json -> fields of arch's config class
        def config_to_hf(self, cfg) -> dict: ...         # our config -> config.json fields (save_hf_model adds
                                                         # architectures, model_type, dtype, bos/eos)
        def default_for(self, cfg) -> bool: ...          # the family an export gets when none is named

``state_dict_from_hf(sd, cfg)`` / ``state_dict_to_hf(sd, cfg)`` rename through ``names`` by default (override
them for tensors that need reshaping, e.g. stacked experts). An option the family cannot represent exactly
raises ``HFConversionError`` naming the config key and value: an import is exact or it fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from longboat.errors import LongboatError
from longboat.utils.registry import Registry, source_of


class HFConversionError(LongboatError, ValueError):
    """A Hugging Face checkpoint cannot be converted exactly (missing file, unknown family, unsupported option)."""


class NameMap:
    """Two-way tensor renaming by templates: ``{i}`` (any field name) matches one name part, e.g. a layer index."""

    def __init__(self, pairs: list[tuple[str, str]]):
        self.pairs = pairs
        self._from_hf = [(_template_regex(hf), ours) for hf, ours in pairs]
        self._to_hf = [(_template_regex(ours), hf) for hf, ours in pairs]

    def from_hf(self, name: str) -> str | None:
        return _apply(self._from_hf, name)

    def to_hf(self, name: str) -> str | None:
        return _apply(self._to_hf, name)


def _template_regex(template: str) -> re.Pattern:
    parts = re.split(r"\{(\w+)\}", template)
    pattern = "".join(re.escape(p) if k % 2 == 0 else rf"(?P<{p}>[^.]+)" for k, p in enumerate(parts))
    return re.compile(pattern + r"\Z")


def _apply(rules: list[tuple[re.Pattern, str]], name: str) -> str | None:
    for regex, target in rules:
        if m := regex.match(name):
            return target.format(**m.groupdict())
    return None


class HFAdapter:
    """Base of every family adapter; see the module docstring for what a subclass provides."""

    model_type: str = ""
    arch: str = "decoder"
    architecture: str = ""
    names: NameMap = NameMap([])
    # HF tensors dropped on import: derived buffers some checkpoints carry.
    ignored_hf_tensors: tuple[str, ...] = (r".*\.rotary_emb\.inv_freq",)

    def config_from_hf(self, hf: dict) -> dict:
        raise NotImplementedError

    def config_to_hf(self, cfg) -> dict:
        raise NotImplementedError

    def config_from_dir(self, hf: dict, hf_dir) -> dict:
        """``config_from_hf`` for a checkpoint directory: a family whose model reads other files there as well (an
        image processor's settings) reads them here."""
        return self.config_from_hf(hf)

    def default_for(self, cfg) -> bool:
        return False

    def shape_matches(self, name: str, got: tuple[int, ...], expected: tuple[int, ...]) -> bool:
        """Whether a checkpoint tensor of shape ``got`` imports where an export writes ``expected`` (a family whose
        checkpoints come in two layouts accepts both)."""
        return got == expected

    def state_dict_from_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        out = {}
        for name, value in sd.items():
            if name == "lm_head.weight" and getattr(cfg, "tie_embeddings", False):
                continue  # a tied head reads the embedding table
            if any(re.fullmatch(p, name) for p in self.ignored_hf_tensors):
                continue
            ours = self.names.from_hf(name)
            if ours is None:
                raise HFConversionError(f"unexpected tensor {name!r} in a {self.model_type} checkpoint")
            out[ours] = value
        return out

    def state_dict_to_hf(self, sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        out = {}
        for name, value in sd.items():
            hf = self.names.to_hf(name)
            if hf is None:
                raise HFConversionError(f"tensor {name!r} has no {self.model_type} counterpart")
            out[hf] = value
        return out


_ADAPTERS: Registry[HFAdapter] = Registry("HF model_type", "known", HFConversionError)


def register_hf_adapter(model_type: str) -> Callable[[type[HFAdapter]], type[HFAdapter]]:
    """Class decorator: register an adapter for checkpoints whose config.json says ``model_type``."""

    def wrap(cls: type[HFAdapter]) -> type[HFAdapter]:
        known = _ADAPTERS.get(model_type, None)
        if known is not None and type(known) is cls:
            return cls  # the very class again: nothing to do
        # The registry holds an instance; the class says where it comes from.
        _ADAPTERS.register(model_type, cls(), source_of(cls))
        cls.model_type = model_type
        return cls

    return wrap


def hf_families() -> list[str]:
    import longboat.models.llm.adapters  # noqa: F401  (fills the registry)

    return _ADAPTERS.names()


def get_hf_adapter(model_type: str) -> HFAdapter:
    hf_families()
    return _ADAPTERS.get(model_type)


def infer_family(cfg) -> str:
    """The family an export of ``cfg`` gets when none is named."""
    for name in hf_families():
        if _ADAPTERS[name].default_for(cfg):
            return name
    raise HFConversionError(f"no HF family represents this model by default; name one of {', '.join(hf_families())}")


# ---- config helpers shared by adapters ----------------------------------------------------------------


def reject(hf: dict, key: str, allowed: Callable[[object], bool], why: str = "") -> None:
    """Fail naming ``key`` when config.json sets it to a value the family cannot represent."""
    if key in hf and not allowed(hf[key]):
        raise HFConversionError(f"config.json {key}={hf[key]!r} is not supported{': ' + why if why else ''}")


_ROPE_KEYS = {
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "attention_factor", "truncate"),
}


def rope_from_hf(hf: dict) -> dict:
    """``rope_theta`` and ``rope_scaling`` fields from either the v5 ``rope_parameters`` or the older keys."""
    params = dict(hf.get("rope_parameters") or {})
    if not params:
        params = {"rope_theta": hf.get("rope_theta", 10000.0), **(hf.get("rope_scaling") or {})}
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    out = {"rope_theta": float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))}
    if kind == "default":
        if params:
            raise HFConversionError(f"config.json rope parameters {params} are not supported with rope_type default")
        return out
    if kind not in _ROPE_KEYS:
        raise HFConversionError(f"config.json rope_type {kind!r} is not supported (supported: default, "
                                f"{', '.join(_ROPE_KEYS)})")
    keys = _ROPE_KEYS[kind]
    extra = sorted(set(params) - set(keys))
    if extra:
        raise HFConversionError(f"config.json {kind} rope parameters {extra} are not supported")
    scaling = {k: params[k] for k in keys if params.get(k) is not None}
    if kind == "yarn":  # transformers' defaults: the original length is the model's, the factor their ratio
        scaling.setdefault("original_max_position_embeddings", hf["max_position_embeddings"])
        scaling.setdefault("factor", hf["max_position_embeddings"] / scaling["original_max_position_embeddings"])
    out["rope_scaling"] = {"type": kind, **scaling}
    return out


def rope_to_hf(cfg) -> dict:
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope |= {"rope_type": s.type, **{k: getattr(s, k) for k in _ROPE_KEYS[s.type] if getattr(s, k) is not None}}
    return {"rope_parameters": rope}
