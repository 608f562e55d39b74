"""Decoder-only language models; importing this package registers the "decoder" architecture."""

from longboat.models.llm import model  # noqa: F401  (registers "decoder")
from longboat.models.llm.cache import KVCache
from longboat.models.llm.config import DecoderConfig, RopeScaling
from longboat.models.llm.model import Decoder
from longboat.models.llm.presets import load_preset, preset_names

__all__ = ["Decoder", "DecoderConfig", "KVCache", "RopeScaling", "load_preset", "preset_names"]
