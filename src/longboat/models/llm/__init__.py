"""Decoder-only language models; importing this package registers the "decoder" architecture."""

from longboat.models.llm.cache import KVCache
from longboat.models.llm.config import DecoderConfig, RopeScaling
from longboat.models.llm.hf_interop import DecoderHF
from longboat.models.llm.model import Decoder
from longboat.models.llm.pipeline_split import decoder_pipeline_split
from longboat.models.contracts import ModelHooks
from longboat.models.moe.contract import MOE_EXPERTS
from longboat.models.registry import ModelSpec, register_model


def _tensor_parallel_plan(cfg: DecoderConfig, tp: int) -> dict:
    # DTensor's parallel styles load with the plan, on first use: a run without tp > 1 never pays for them.
    from longboat.models.llm.parallel_plan import checked_tensor_parallel_plan

    return checked_tensor_parallel_plan(cfg, tp)


def _moe_aux(model: Decoder) -> dict | None:
    return model.moe_aux()


def _after_optimizer_step(model: Decoder, dp_group) -> None:
    model.after_optimizer_step(dp_group)


def _output_head(model: Decoder):
    return (lambda tokens, positions: model.hidden_states(tokens, positions)), model.output_weight


DECODER = register_model(ModelSpec(
    name="decoder",
    config=DecoderConfig,
    module=Decoder,
    presets="longboat.models.llm",
    parallel_units=("layers",),
    tensor_parallel=_tensor_parallel_plan,
    hf=DecoderHF(),
    pipeline=decoder_pipeline_split,
    hooks=ModelHooks(aux=_moe_aux, after_optimizer_step=_after_optimizer_step, experts=MOE_EXPERTS,
                     output_head=_output_head),
))
load_preset = DECODER.load_preset
preset_names = DECODER.preset_names

__all__ = ["DECODER", "Decoder", "DecoderConfig", "KVCache", "RopeScaling", "load_preset", "preset_names"]
