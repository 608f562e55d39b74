"""Hugging Face checkpoint adapters, one module per HF ``model_type``; importing this package registers them."""

from longboat.models.llm.adapters import deepseek_v3, llama, mistral, mixtral, qwen2, qwen3, qwen3_moe  # noqa: F401
