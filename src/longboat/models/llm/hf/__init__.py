"""Hugging Face checkpoints in and out: family adapters (``adapter``) and directory IO (``io``)."""

from longboat.models.llm.hf.adapter import (
    HFAdapter,
    HFConversionError,
    NameMap,
    get_hf_adapter,
    hf_families,
    infer_family,
    register_hf_adapter,
    reject,
    rope_from_hf,
    rope_to_hf,
)
from longboat.models.llm.hf.stream import SINGLE_WEIGHTS, WEIGHTS_INDEX, HFWeights, check_hf_tensors
from longboat.models.llm.hf.io import (
    GENERATION_CONFIG,
    HF_CONFIG,
    SIDE_FILES,
    hf_config_fields,
    hf_model_config,
    load_hf_model,
    parse_size,
    read_hf_config,
    read_hf_state_dict,
    read_hf_weights,
    resolve_dtype,
    save_hf_model,
)

__all__ = [
    "GENERATION_CONFIG", "HF_CONFIG", "SIDE_FILES", "SINGLE_WEIGHTS", "WEIGHTS_INDEX",
    "HFAdapter", "HFConversionError", "HFWeights", "NameMap", "check_hf_tensors", "get_hf_adapter", "hf_config_fields",
    "hf_families", "hf_model_config", "infer_family", "load_hf_model", "parse_size", "read_hf_config",
    "read_hf_state_dict", "read_hf_weights", "register_hf_adapter", "reject", "resolve_dtype", "rope_from_hf",
    "rope_to_hf", "save_hf_model",
]
