"""Hugging Face checkpoint adapters, one module per HF ``model_type``; importing this package registers them."""

from longboat.models.llm.adapters import (  # noqa: F401
    deepseek_v3,
    ernie4_5_moe,
    llama,
    mistral,
    mixtral,
    qwen2,
    qwen3,
    qwen3_moe,
)
