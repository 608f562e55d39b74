"""How the decoder is cut into pipeline stages: the embedding on the first, the final norm and head on the last."""

from __future__ import annotations

from longboat.config.base import ConfigError
from longboat.models.llm.config import DecoderConfig
from longboat.models.registry import PipelineSplit


def decoder_pipeline_split(cfg: DecoderConfig) -> PipelineSplit:
    if cfg.tie_embeddings:
        raise ConfigError("parallel.pp > 1 needs model.tie_embeddings=false: the head on the last stage would read "
                          "the embedding table of the first")
    return PipelineSplit(layers="layers", first=("tok_embeddings",), last=("norm", "output"),
                         tp_sequence_dim=1)  # sequence parallel (parallel_plan)
