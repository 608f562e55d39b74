"""The vision-language model's tensor-parallel plan: the decoder's, under ``language.``, around embeddings it is given.

The decoder's plan shards its embedding's output over the sequence; here the image features are written into the
whole embeddings first, so the embedding table (row-parallel) returns them replicated and the decoder shards them
over the sequence as it takes them. The tower and projector stay replicated: they are small beside the decoder.
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, PrepareModuleInputOutput, RowwiseParallel

from longboat.config.base import ConfigError
from longboat.models.llm.parallel_plan import checked_tensor_parallel_plan
from longboat.models.vlm.config import VLMConfig


def vlm_tensor_parallel_plan(cfg: VLMConfig, tp: int) -> dict[str, ParallelStyle]:
    if tp > 1 and getattr(cfg.vision, "deepstack_layers", ()):
        raise ConfigError(f"parallel.tp={tp}: DeepStack (model.vision.deepstack_layers) adds tower features inside "
                          "the decoder, which a sequence-sharded decoder cannot take yet; use parallel.tp 1")
    if tp > 1 and cfg.language.vision_moe is not None:
        raise ConfigError(f"parallel.tp={tp}: experts routed by token type (model.language.vision_moe) have no "
                          "tensor-parallel plan yet; use parallel.tp 1")
    plan = checked_tensor_parallel_plan(cfg.language, tp)
    plan.pop("")  # the decoder's logits are gathered where the decoder returns them, below
    out = {f"language.{name}": style for name, style in plan.items()}
    out["language.tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    # language(embeddings, positions, cache, segments): embeddings sharded over the sequence on the way in, logits
    # (sharded over the vocabulary by the head) gathered on the way out.
    out["language"] = PrepareModuleInputOutput(
        input_layouts=(Replicate(), None, None, None), desired_input_layouts=(Shard(1), None, None, None),
        use_local_input=True, output_layouts=Shard(-1), desired_output_layouts=Replicate(), use_local_output=True)
    return out
