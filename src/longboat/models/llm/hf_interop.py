"""The decoder's Hugging Face interop, as its ``ModelSpec`` presents it to the engine (see ``hf.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from longboat.models.llm.config import DecoderConfig


class DecoderHF:
    """llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, deepseek_v3 and ernie4_5_moe checkpoints in and out."""

    def families(self) -> list[str]:
        from longboat.models.llm.hf import get_hf_adapter, hf_families

        return [f for f in hf_families() if get_hf_adapter(f).arch == "decoder"]  # others build other models

    def load(self, hf_dir: str | Path, dtype: str | None = None) -> tuple[Any, DecoderConfig, str, dict[str, Path]]:
        """``(model, config, family, files to carry)``; the stored dtype unless ``dtype`` is given."""
        from longboat.models.llm.hf import SIDE_FILES, load_hf_model

        model, cfg, family = load_hf_model(hf_dir, dtype)
        carried = {name: Path(hf_dir) / name for name in SIDE_FILES if (Path(hf_dir) / name).is_file()}
        return model, cfg, family, carried

    def config_fields(self, hf_dir: str | Path) -> dict:
        from longboat.models.llm.hf import hf_config_fields

        return hf_config_fields(hf_dir)[1]

    def read_weights(self, hf_dir: str | Path, cfg: DecoderConfig) -> dict:
        from longboat.models.llm.hf import get_hf_adapter, read_hf_config, read_hf_weights

        return read_hf_weights(hf_dir, get_hf_adapter(read_hf_config(hf_dir).get("model_type")), cfg)

    def stream_weights(self, hf_dir: str | Path, cfg: DecoderConfig) -> Iterator[dict]:
        """``read_weights`` one shard file at a time: the tensors each file completes, as stored."""
        from longboat.models.llm.hf import HFWeights, get_hf_adapter, read_hf_config

        yield from HFWeights(hf_dir, get_hf_adapter(read_hf_config(hf_dir).get("model_type")), cfg).groups()

    def export_family(self, cfg: DecoderConfig, requested: bool | str, source: str | Path | None) -> str:
        """The family named, else the HF source's, else the one the config implies; checked to fit ``cfg``."""
        from longboat.models.llm.hf import get_hf_adapter, infer_family, read_hf_config

        family = requested
        if family is True:
            family = read_hf_config(source)["model_type"] if source else infer_family(cfg)
        get_hf_adapter(family).config_to_hf(cfg)  # raises, naming the option, when the family cannot hold cfg
        return family

    def tensor_name(self, family: str, name: str) -> str | None:
        """Our tensor name in ``family``'s checkpoints (e.g. for adapters of that module), None if it has none."""
        from longboat.models.llm.hf import get_hf_adapter

        return get_hf_adapter(family).names.to_hf(name)

    def save(self, weights: Any, family: str, out: str | Path, cfg: DecoderConfig,
             tokenizer_dir: str | Path | None = None, dtype: str | None = None,
             max_shard_size: int | str = "5GB") -> Path:
        from longboat.models.llm.hf import save_hf_model

        return save_hf_model(weights, family, out, dtype=dtype, tokenizer_dir=tokenizer_dir,
                             max_shard_size=max_shard_size, cfg=cfg)
