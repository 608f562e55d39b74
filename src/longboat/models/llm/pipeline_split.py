"""How the decoder is cut into pipeline stages: the embedding on the first, the final norm and head on the last (with
the embedding table too when the head reads it, tied embeddings)."""

from __future__ import annotations

from longboat.models.llm.config import DecoderConfig
from longboat.models.registry import PipelineSplit


def decoder_pipeline_split(cfg: DecoderConfig) -> PipelineSplit:
    tied = cfg.tie_embeddings  # the head reads the embedding table: there is no `output` module
    return PipelineSplit(layers="layers", first=("tok_embeddings",), last=("norm",) if tied else ("norm", "output"),
                         tied=("tok_embeddings",) if tied else (),
                         tp_sequence_dim=1)  # sequence parallel (parallel_plan)
