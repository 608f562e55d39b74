"""Hugging Face checkpoints in and out: one adapter per HF ``model_type``, plus config.json/safetensors IO.

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

Entry points: ``load_hf_model(dir, dtype=None) -> (model, cfg, family)`` and
``save_hf_model(model, family, out_dir, dtype=None, tokenizer_dir=None, max_shard_size="5GB")``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from longboat.errors import LongboatError

HF_CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
# Carried between HF directories and our exports untouched.
SIDE_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json", GENERATION_CONFIG,
)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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

    def default_for(self, cfg) -> bool:
        return False

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


_ADAPTERS: dict[str, HFAdapter] = {}


def register_hf_adapter(model_type: str) -> Callable[[type[HFAdapter]], type[HFAdapter]]:
    """Class decorator: register an adapter for checkpoints whose config.json says ``model_type``."""

    def wrap(cls: type[HFAdapter]) -> type[HFAdapter]:
        if model_type in _ADAPTERS:
            raise ValueError(f"HF adapter {model_type!r} registered twice")
        cls.model_type = model_type
        _ADAPTERS[model_type] = cls()
        return cls

    return wrap


def hf_families() -> list[str]:
    import longboat.models.llm.adapters  # noqa: F401  (fills the registry)

    return sorted(_ADAPTERS)


def get_hf_adapter(model_type: str) -> HFAdapter:
    known = hf_families()
    if model_type not in _ADAPTERS:
        raise HFConversionError(f"unknown HF model_type {model_type!r}; known: {', '.join(known)}")
    return _ADAPTERS[model_type]


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
    if kind != "llama3":
        raise HFConversionError(f"config.json rope_type {kind!r} is not supported (supported: default, llama3)")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    extra = sorted(set(params) - set(keys))
    if extra:
        raise HFConversionError(f"config.json llama3 rope parameters {extra} are not supported")
    out["rope_scaling"] = {"type": "llama3", **{k: params[k] for k in keys}}
    return out


def rope_to_hf(cfg) -> dict:
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope |= {"rope_type": s.type, "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                 "high_freq_factor": s.high_freq_factor,
                 "original_max_position_embeddings": s.original_max_position_embeddings}
    return {"rope_parameters": rope}


# ---- files ----------------------------------------------------------------------------------------------


def read_hf_config(hf_dir: str | os.PathLike) -> dict:
    path = Path(hf_dir) / HF_CONFIG
    if not path.is_file():
        raise HFConversionError(f"{hf_dir}: not a Hugging Face checkpoint (no {HF_CONFIG})")
    return json.loads(path.read_text())


def read_hf_state_dict(hf_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors`` or of the shards ``model.safetensors.index.json`` names."""
    hf_dir = Path(hf_dir)
    if (hf_dir / WEIGHTS_INDEX).is_file():
        weight_map = json.loads((hf_dir / WEIGHTS_INDEX).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (hf_dir / SINGLE_WEIGHTS).is_file():
        files = [SINGLE_WEIGHTS]
    else:
        raise HFConversionError(f"{hf_dir}: no {SINGLE_WEIGHTS} or {WEIGHTS_INDEX}")
    state = {}
    for name in files:
        if not (hf_dir / name).is_file():
            raise HFConversionError(f"{hf_dir}: shard {name} named by {WEIGHTS_INDEX} is missing")
        with safe_open(str(hf_dir / name), framework="pt") as f:
            for key in f.keys():
                state[key] = f.get_tensor(key)
    return state


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise HFConversionError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def parse_size(size: int | str) -> int:
    """``5GB``, ``200MB``, ``4096`` -> bytes (decimal units, as transformers uses)."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", size.upper())
    if not m:
        raise HFConversionError(f"max_shard_size {size!r} is not a size like 5GB or 200MB")
    scale = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9}[m.group(2)]
    return int(float(m.group(1)) * scale)


def load_hf_model(hf_dir: str | os.PathLike, dtype: str | torch.dtype | None = None):
    """Build our model from an HF directory: ``(model, cfg, family)``; dtype preserved unless given."""
    from longboat.models import get_model

    adapter, cfg = hf_model_config(hf_dir)
    state = read_hf_weights(hf_dir, adapter, cfg)
    model = get_model(adapter.arch).build(cfg)
    model.load_state_dict(state, strict=True)
    target = resolve_dtype(dtype) or _stored_dtype(state)
    return model.to(target).eval(), cfg, adapter.model_type


def hf_config_fields(hf_dir: str | os.PathLike) -> tuple[str, dict]:
    """``(our architecture name, its config fields)`` from an HF directory's config.json, not yet validated."""
    hf = read_hf_config(hf_dir)
    adapter = get_hf_adapter(hf.get("model_type"))
    return adapter.arch, adapter.config_from_hf(hf)


def hf_model_config(hf_dir: str | os.PathLike):
    """``(adapter, our validated config)`` from an HF directory's config.json."""
    from longboat.config.base import validate
    from longboat.models import get_model

    adapter = get_hf_adapter(read_hf_config(hf_dir).get("model_type"))
    config_cls = get_model(adapter.arch).config
    fields = adapter.config_from_hf(read_hf_config(hf_dir))
    return adapter, validate(config_cls, fields, str(Path(hf_dir) / HF_CONFIG), prefix="model")


def read_hf_weights(hf_dir: str | os.PathLike, adapter: HFAdapter, cfg) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under our names, checked against the model ``cfg`` describes (built on meta)."""
    from longboat.models import get_model

    with torch.device("meta"):
        reference = get_model(adapter.arch).build(cfg).state_dict()
    state = read_hf_state_dict(hf_dir)
    check_hf_tensors(adapter, cfg, reference, state)
    return adapter.state_dict_from_hf(state, cfg)


def check_hf_tensors(adapter: HFAdapter, cfg, ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """Name every missing tensor, unexpected tensor and shape mismatch of an HF state dict against our model."""
    expected = {k: tuple(v.shape) for k, v in adapter.state_dict_to_hf(ours, cfg).items()}
    drop = [r"lm_head\.weight"] if getattr(cfg, "tie_embeddings", False) else []
    got = {k: tuple(v.shape) for k, v in theirs.items()
           if not any(re.fullmatch(p, k) for p in (*adapter.ignored_hf_tensors, *drop))}
    missing, unexpected = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing or unexpected:
        raise HFConversionError(
            f"{adapter.model_type} checkpoint does not match its config.json: "
            f"missing tensors {_short(missing)}, unexpected tensors {_short(unexpected)}"
        )
    wrong = [f"{k}: checkpoint {got[k]}, config.json implies {expected[k]}" for k in expected if got[k] != expected[k]]
    if wrong:
        raise HFConversionError(f"shape mismatch: {'; '.join(wrong[:5])}" + (" ..." if len(wrong) > 5 else ""))


def _short(names: list[str], limit: int = 8) -> str:
    return "[" + ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "") + "]"


def _stored_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    floats = [v.dtype for v in state.values() if v.is_floating_point()]
    return max(set(floats), key=floats.count) if floats else torch.float32


def save_hf_model(
    model: torch.nn.Module | dict[str, torch.Tensor],
    family: str,
    out_dir: str | os.PathLike,
    dtype: str | torch.dtype | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
    max_shard_size: int | str = "5GB",
    *,
    cfg=None,
) -> Path:
    """Write a transformers-loadable directory atomically (``<out>.tmp`` then renamed).

    ``model`` is a module with ``.cfg`` or a full state dict plus ``cfg``. Tokenizer files and
    ``generation_config.json`` are carried from ``tokenizer_dir`` when present there.
    """
    cfg = cfg if cfg is not None else model.cfg
    adapter = get_hf_adapter(family)
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    target = resolve_dtype(dtype) or next(v.dtype for v in state.values() if v.is_floating_point())
    hf_state = {k: v.detach().to("cpu", target).contiguous() for k, v in adapter.state_dict_to_hf(state, cfg).items()}

    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _write_shards(tmp, hf_state, parse_size(max_shard_size))
    tokens = _special_token_ids(tokenizer_dir)
    dtype_name = str(target).removeprefix("torch.")
    config = {"architectures": [adapter.architecture], "model_type": family, **adapter.config_to_hf(cfg),
              **tokens, "dtype": dtype_name, "torch_dtype": dtype_name}
    (tmp / HF_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer_dir is not None:
        for name in SIDE_FILES:
            if (Path(tokenizer_dir) / name).is_file():
                shutil.copy2(Path(tokenizer_dir) / name, tmp / name)
    if not (tmp / GENERATION_CONFIG).is_file():
        (tmp / GENERATION_CONFIG).write_text(json.dumps(tokens, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def _write_shards(out: Path, state: dict[str, torch.Tensor], max_bytes: int) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out / SINGLE_WEIGHTS), metadata={"format": "pt"})
        return
    weight_map = {}
    for k, shard in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, fname)
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _special_token_ids(tokenizer_dir: str | os.PathLike | None) -> dict:
    """bos/eos ids from the carried generation_config.json, else from the tokenizer; empty when neither says."""
    if tokenizer_dir is None:
        return {}
    gen = Path(tokenizer_dir) / GENERATION_CONFIG
    if gen.is_file():
        data = json.loads(gen.read_text())
        return {k: data[k] for k in ("bos_token_id", "eos_token_id") if data.get(k) is not None}
    if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return {}
    from longboat.data.tokenizer import Tokenizer

    tok = Tokenizer(tokenizer_dir)
    return {k: v for k, v in (("bos_token_id", tok.bos_id), ("eos_token_id", tok.eos_id)) if v is not None}


# ---- kept for callers that map a bare DecoderConfig (tests, benchmarks) -------------------------------------


def hf_architecture(cfg) -> str:
    """The transformers class that computes the same function as ``Decoder(cfg)``."""
    return get_hf_adapter(infer_family(cfg)).architecture


def hf_config_dict(cfg) -> dict:
    """Keyword arguments for the transformers config class of ``hf_architecture(cfg)``."""
    return get_hf_adapter(infer_family(cfg)).config_to_hf(cfg)


def from_hf_name(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``layers.0.attention.wq.weight``."""
    ours = get_hf_adapter("llama").names.from_hf(name)
    if ours is None:
        raise HFConversionError(f"unexpected tensor {name!r}")
    return ours


def from_hf_state_dict(state: dict, cfg) -> dict:
    """Rename an HF state dict to ours; a tied head is dropped (ours reads the embedding table)."""
    return get_hf_adapter(infer_family(cfg)).state_dict_from_hf(state, cfg)
