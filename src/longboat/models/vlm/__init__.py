"""The composed vision-language model; importing this package registers the "vlm" architecture."""

from longboat.models.contracts import ModelHooks
from longboat.models.llm import DECODER
from longboat.models.moe.contract import MOE_EXPERTS
from longboat.models.registry import ModelSpec, register_model
from longboat.models.vlm import qwen_vl_hf  # noqa: F401  (registers the qwen2_5_vl checkpoints)
from longboat.models.vlm import ernie_vl_hf  # noqa: F401  (registers the ernie4_5_vl_moe checkpoints)
from longboat.models.vlm.hf import VLMHF
from longboat.models.vlm import smolvlm_hf  # noqa: F401  (registers smolvlm, idefics3)
from longboat.models.vlm.config import ProjectorConfig, QwenTower, VLMConfig, ViTTower
from longboat.models.vlm.model import VLM

IMAGE_INPUTS = ("images", "image_slots", "image_grid")


def _tensor_parallel_plan(cfg: VLMConfig, tp: int) -> dict:
    from longboat.models.vlm.parallel_plan import vlm_tensor_parallel_plan

    return vlm_tensor_parallel_plan(cfg, tp)


def _model_inputs(batch: dict) -> dict:
    return {key: batch[key] for key in IMAGE_INPUTS if key in batch}


def _aux(model: VLM) -> dict | None:
    return DECODER.hooks.aux(model.language)


def _after_optimizer_step(model: VLM, dp_group) -> None:
    DECODER.hooks.after_optimizer_step(model.language, dp_group)


VLM_SPEC = register_model(ModelSpec(
    name="vlm",
    config=VLMConfig,
    module=VLM,
    parallel_units=("vision.blocks", "language.layers"),
    tensor_parallel=_tensor_parallel_plan,
    hf=VLMHF(),
    hooks=ModelHooks(aux=_aux, after_optimizer_step=_after_optimizer_step, experts=MOE_EXPERTS,
                     model_inputs=_model_inputs),
))

__all__ = ["IMAGE_INPUTS", "VLM", "VLMConfig", "VLM_SPEC", "ProjectorConfig", "QwenTower", "ViTTower"]
