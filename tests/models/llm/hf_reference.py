"""Transformers counterparts of a bare ``DecoderConfig``, for parity tests and benchmarks."""

from __future__ import annotations

from longboat.models.llm.hf import HFConversionError, get_hf_adapter, infer_family


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
